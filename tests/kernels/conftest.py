"""Kernel tests run on CPU under the Triton interpreter.

The interpreter is chosen when a ``@triton.jit`` function is defined, so ``TRITON_INTERPRET=1``
must be set before :mod:`agentlang.kernels` is first imported: ``tests/conftest.py`` sets it
(other test folders, collected first, import the kernels too); this file checks it held.
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

if "agentlang.kernels" in sys.modules:  # imported earlier in this process, before the variable was set
    from agentlang.kernels._common import is_interpreted
    from agentlang.kernels.decode_attention import _decode_stage1

    if not is_interpreted(_decode_stage1):
        raise RuntimeError(
            "agentlang.kernels was imported before TRITON_INTERPRET=1 was set (tests/conftest.py); "
            "run the kernel tests in their own pytest process"
        )
