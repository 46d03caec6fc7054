"""agentlang runtime: paged KV pool, radix prefix cache, continuous batching engine.

The public names below load on first use (PEP 562), so importing a light submodule (e.g.
``runtime.typed_values`` from the frontend, ``runtime.kv_quant`` from the kernels) does not
pull in the engine, the model or the tokenizer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Engine": "runtime.engine", "PrefixHandle": "runtime.engine",
    "CompletionOutput": "runtime.outputs", "RequestOutput": "runtime.outputs",
    "StreamDelta": "runtime.outputs", "TokenLogprob": "runtime.sampler",
    "SamplingParams": "runtime.sampling_params",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from runtime.engine import Engine, PrefixHandle
    from runtime.outputs import CompletionOutput, RequestOutput, StreamDelta
    from runtime.sampler import TokenLogprob
    from runtime.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
