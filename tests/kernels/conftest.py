"""Kernel tests run on CPU under the Triton interpreter.

The interpreter is chosen when a ``@triton.jit`` function is defined, so ``TRITON_INTERPRET=1``
must be set before :mod:`kernels` is first imported; pytest loads this file before the test
modules beside it. Only triton reads the variable, so tests elsewhere are unaffected.

(The folder is not called ``tests/kernels``: next to ``tests/conftest.py`` pytest puts ``tests/``
on ``sys.path``, where a ``kernels`` folder would shadow the ``kernels`` package.)
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

if "kernels" in sys.modules:  # imported earlier in this process, before the variable was set
    from agentlang.kernels._common import is_interpreted
    from agentlang.kernels.decode_attention import _decode_stage1

    if not is_interpreted(_decode_stage1):
        raise RuntimeError(
            "kernels was imported before tests/kernels/conftest.py set TRITON_INTERPRET=1; "
            "run the kernel tests in their own pytest process"
        )
