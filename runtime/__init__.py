"""agentlang runtime: paged KV pool, radix prefix cache, continuous batching engine.

The public names below load on first use (PEP 562), so importing a light submodule (e.g.
``agentlang.runtime.core.typed_values`` from the frontend, ``agentlang.runtime.cache.kv_quant`` from the kernels) does not
pull in the engine, the model or the tokenizer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Engine": "agentlang.runtime.engine.engine", "PrefixHandle": "agentlang.runtime.engine.engine",
    "CompletionOutput": "agentlang.runtime.request.outputs", "RequestOutput": "agentlang.runtime.request.outputs",
    "StreamDelta": "agentlang.runtime.request.outputs", "TokenLogprob": "agentlang.runtime.sampling.sampler",
    "SamplingParams": "agentlang.runtime.sampling.params",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from agentlang.runtime.engine.engine import Engine, PrefixHandle
    from agentlang.runtime.request.outputs import CompletionOutput, RequestOutput, StreamDelta
    from agentlang.runtime.sampling.sampler import TokenLogprob
    from agentlang.runtime.sampling.params import SamplingParams


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
