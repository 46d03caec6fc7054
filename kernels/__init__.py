"""Triton kernels for paged attention over the KV pool of :mod:`agentlang.runtime.cache.kv_pool`.

Each kernel has a pure-torch float64 reference beside it (``*_ref``) for tests and benchmarks.
The kernels run on CUDA tensors; on CPU they run under the Triton interpreter, which must be
switched on (``TRITON_INTERPRET=1``) before this package is first imported. Importing works
everywhere triton is installed; a launch the setup cannot run raises a clear error.
"""

from agentlang.kernels._common import LaunchConfig, check_ranges, page_table_checks
from agentlang.kernels.decode_attention import (
    choose_num_splits,
    decode_attention,
    decode_attention_ref,
    default_decode_config,
)
from agentlang.kernels.extend_attention import (
    default_extend_config,
    extend_attention,
    extend_attention_ref,
)
from agentlang.kernels.kv_store import store_kv, store_kv_ref
from agentlang.kernels.page_copy import copy_pages, copy_pages_ref

__all__ = [
    "LaunchConfig",
    "check_ranges",
    "choose_num_splits",
    "copy_pages",
    "copy_pages_ref",
    "decode_attention",
    "decode_attention_ref",
    "default_decode_config",
    "default_extend_config",
    "extend_attention",
    "extend_attention_ref",
    "page_table_checks",
    "store_kv",
    "store_kv_ref",
]
