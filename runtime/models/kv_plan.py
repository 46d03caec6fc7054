"""KV capacity planner: how many requests of a given context fit in a given memory.

The KV cache, not the weights, bounds concurrency::

    KV bytes per token   = layers x 2 (K, V) x kv_heads x (head_dim x element bytes + scale bytes)
    KV bytes per request = ceil(context / page_size) pages x page_size x bytes per token
    max concurrent       = (memory - weights) // KV bytes per request

A model with sliding-window layers (Gemma 2 / 3) keeps their KV for the window only
(:mod:`agentlang.runtime.cache.window_pages`): a request costs its whole context in the global
layers plus ``min(pages, ceil((window - 1) / page_size) + 2)`` pages in the sliding ones, and
the plan names the ``window_kv_fraction`` that splits an engine's pool that way.

Scale bytes are those of the 8-bit formats (one float16 per token and KV head, see
:mod:`agentlang.runtime.cache.kv_quant`); the per-token figure is :meth:`agentlang.runtime.cache.kv_pool.KVLayout.bytes_per_token`,
the same number the engine sizes its pool with. Weights are counted as parameters x the model
dtype's bytes, or x a ``weights`` storage format's bytes per weight (``q4_1``: 20 bytes per
32-weight block, ...; :data:`WEIGHT_FORMATS`). Parameters are read from the safetensors headers
when a model directory has them, else computed from its ``config.json`` alone (planning before
downloading); a GGUF file's weights are its tensors' bytes. Activations and allocator
overheads are not counted.

:func:`plan` is a pure function of a config; :func:`plan_for_model` resolves a model name or
directory; :func:`describe_engine` gives the same figures for a running engine (for the
server's ``/get_model_info``).
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agentlang.runtime.cache.kv_pool import KVLayout
from agentlang.runtime.cache.kv_quant import KV_DTYPES
from agentlang.runtime.cache.window_pages import request_window_pages
from agentlang.runtime.models.gemma_config import layer_windows

FLOAT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PLAN_KV_DTYPES = KV_DTYPES + tuple(d for d in FLOAT_DTYPES if d not in KV_DTYPES)   # plus
# plain float caches of any width
GIB = 2**30
# bytes per weight of each storage format (GGUF blocks: bytes per block / weights per block)
WEIGHT_FORMATS = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32,
                  "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32, "q6_k": 210 / 256,
                  "q5_k": 176 / 256, "q4_k": 144 / 256, "q3_k": 110 / 256, "q2_k": 84 / 256}


@dataclass(frozen=True)
class KVPlan:
    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    model_dtype: str
    kv_dtype: str                  # effective storage dtype ("auto" resolved)
    page_size: int
    context: int
    memory_bytes: int
    num_parameters: int
    weights_format: str            # the model dtype, a WEIGHT_FORMATS name, or "gguf"
    weights_bytes: int
    bytes_per_token: int
    bytes_per_request: int         # whole pages: ceil(context / page_size) * page_size tokens
    kv_budget_bytes: int           # memory - weights, >= 0
    max_concurrent_requests: int
    window: int = 0                # the sliding layers' window (0: none)
    window_layers: int = 0         # layers with a sliding window
    bytes_per_request_full_length: int = 0   # the same request if every layer kept it all
    window_kv_fraction: float = 1.0          # the engine's split for requests of this context

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        pages = -(-self.context // self.page_size)
        lines = [
            ("model", f"{self.model} ({self.num_layers} layers, {self.num_kv_heads} KV heads x "
                      f"{self.head_dim} dims)"),
            ("kv dtype", f"{self.kv_dtype} (model dtype {self.model_dtype})"),
            ("page size", f"{self.page_size} tokens"),
            ("KV per token", f"{_size(self.bytes_per_token)} ({self.bytes_per_token:,} bytes)"),
            ("KV per request", f"{_size(self.bytes_per_request)} at {self.context:,} tokens "
                               f"({pages:,} pages)"),
            *([("sliding window", f"{self.window:,} tokens in {self.window_layers} of "
                                  f"{self.num_layers} layers: full-length KV would take "
                                  f"{_size(self.bytes_per_request_full_length)} "
                                  f"(window_kv_fraction {self.window_kv_fraction:.4f})")]
              if self.window else []),
            ("weights", f"{_size(self.weights_bytes)} ({self.num_parameters:,} parameters, "
                        f"{self.weights_format})"),
            ("memory", _size(self.memory_bytes)),
            ("KV budget", f"{_size(self.kv_budget_bytes)} (memory - weights)"),
            ("max concurrent", f"{self.max_concurrent_requests:,} requests of "
                               f"{self.context:,} tokens"),
        ]
        return "\n".join(f"{k:<16}{v}" for k, v in lines)


def _size(n: int) -> str:
    for unit, div in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def _get(cfg: Any, attr: str, key: str, default: Any = None) -> Any:
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, attr, default)


def model_dims(config: Any) -> dict[str, int | bool]:
    """Sizes needed for planning, from a :class:`~agentlang.runtime.models.config.LlamaConfig` or an HF
    ``config.json`` dict."""
    heads = _get(config, "num_heads", "num_attention_heads")
    hidden = _get(config, "hidden_size", "hidden_size")
    dims = {
        "num_layers": _get(config, "num_layers", "num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": _get(config, "num_kv_heads", "num_key_value_heads") or heads,
        "head_dim": _get(config, "head_dim", "head_dim") or (hidden // heads if hidden and heads
                                                             else None),
        "hidden_size": hidden,
        "intermediate_size": _get(config, "intermediate_size", "intermediate_size"),
        "vocab_size": _get(config, "vocab_size", "vocab_size"),
    }
    for name in ("num_layers", "num_heads", "num_kv_heads", "head_dim"):
        v = dims[name]
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"config: {name} must be a positive integer, got {v!r}")
    dims["tie_word_embeddings"] = bool(_get(config, "tie_word_embeddings",
                                            "tie_word_embeddings", False))
    dims["layer_windows"] = layer_windows(config, dims["head_dim"]) if isinstance(config, dict) \
        else tuple(getattr(config, "layer_windows", ()))
    return dims


def count_parameters(config: Any) -> int:
    """Parameters of a Llama-family model from its config (embeddings, attention, SwiGLU MLP,
    RMSNorms, untied LM head)."""
    d = model_dims(config)
    H, I, V = d["hidden_size"], d["intermediate_size"], d["vocab_size"]
    if not all(isinstance(x, int) and x > 0 for x in (H, I, V)):
        raise ValueError("config: hidden_size, intermediate_size and vocab_size are needed to "
                         "count parameters (or give weights_bytes)")
    q, kv = d["num_heads"] * d["head_dim"], d["num_kv_heads"] * d["head_dim"]
    per_layer = H * q + 2 * H * kv + q * H + 3 * H * I + 2 * H
    lm_head = 0 if d["tie_word_embeddings"] else V * H
    return V * H + d["num_layers"] * per_layer + H + lm_head


def count_safetensors_parameters(model_dir: str | Path) -> int:
    """Parameters stored in a directory's ``*.safetensors`` files (headers only are read)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors files in {model_dir}")
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                total += math.prod(info["shape"])
    return total


def kv_layout(config: Any, kv_dtype: str, model_dtype: str) -> KVLayout:
    """The pool layout a model would get with ``kv_dtype`` (a plain float name stores K/V in
    that dtype)."""
    if kv_dtype not in PLAN_KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {list(PLAN_KV_DTYPES)}, got {kv_dtype!r}")
    if model_dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {list(FLOAT_DTYPES)}, got {model_dtype!r}")
    d = model_dims(config)
    if kv_dtype in FLOAT_DTYPES:
        return KVLayout(d["num_layers"], d["num_kv_heads"], d["head_dim"], FLOAT_DTYPES[kv_dtype],
                        layer_windows=d["layer_windows"])
    return KVLayout(d["num_layers"], d["num_kv_heads"], d["head_dim"], FLOAT_DTYPES[model_dtype],
                    kv_dtype, d["layer_windows"])


def pages_per_request(context: int, page_size: int) -> int:
    return -(-context // page_size)


def max_concurrent_requests(budget_bytes: int, bytes_per_token: int, context: int,
                            page_size: int) -> int:
    """Requests of ``context`` tokens whose pages fit in ``budget_bytes`` at once."""
    pages = budget_bytes // (bytes_per_token * page_size)
    return max(0, pages // pages_per_request(context, page_size))


def request_bytes(layout: KVLayout, context: int, page_size: int) -> tuple[int, float]:
    """(KV bytes of one request of ``context`` tokens, the window pages a global page it
    needs): whole pages; a sliding layer holds the window's pages only."""
    pages = pages_per_request(context, page_size)
    if not layout.window:
        return pages * page_size * layout.bytes_per_token(), 1.0
    win = min(pages, request_window_pages(layout.window, page_size))
    g = layout.bytes_per_token(len(layout.global_layers))
    w = layout.bytes_per_token(len(layout.window_layers))
    return (pages * g + win * w) * page_size, win / pages


def plan(
    config: Any,
    *,
    context: int,
    memory_gb: float,
    kv_dtype: str = "auto",
    page_size: int = 16,
    model_dtype: str | None = None,
    num_parameters: int | None = None,
    model: str = "model",
    weights: str | None = None,
    weights_bytes: int | None = None,
) -> KVPlan:
    """Plan for ``config`` (LlamaConfig or HF config dict) in ``memory_gb`` GiB.

    ``model_dtype`` defaults to the config dict's ``torch_dtype``/``dtype`` entry, else
    bfloat16; ``kv_dtype="auto"`` stores K/V in it. ``num_parameters`` defaults to a count from
    the config. Weight bytes: ``weights_bytes`` if given (e.g. a GGUF file's), else parameters x
    the ``weights`` format's bytes per weight (:data:`WEIGHT_FORMATS`), else x the model dtype's."""
    if weights is not None and weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {list(WEIGHT_FORMATS)}, got {weights!r}")
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise ValueError(f"context must be a positive integer, got {context!r}")
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
    if not isinstance(memory_gb, (int, float)) or not memory_gb > 0:
        raise ValueError(f"memory_gb must be > 0, got {memory_gb!r}")
    if model_dtype is None:
        declared = config.get("torch_dtype") or config.get("dtype") if isinstance(config, dict) \
            else None
        model_dtype = declared or "bfloat16"
    layout = kv_layout(config, kv_dtype, model_dtype)
    d = model_dims(config)
    params = count_parameters(config) if num_parameters is None else num_parameters
    if weights_bytes is not None:
        fmt = "gguf"
    elif weights is not None:
        fmt, weights_bytes = weights, math.ceil(params * WEIGHT_FORMATS[weights])
    else:
        fmt = model_dtype
        weights_bytes = params * torch.empty((), dtype=FLOAT_DTYPES[model_dtype]).element_size()
    weights = weights_bytes
    memory = int(memory_gb * GIB)
    bpt = layout.bytes_per_token()
    budget = max(0, memory - weights)
    per_request, fraction = request_bytes(layout, context, page_size)
    return KVPlan(
        model=model, num_layers=d["num_layers"], num_kv_heads=d["num_kv_heads"],
        head_dim=d["head_dim"], model_dtype=model_dtype, kv_dtype=layout.kv_dtype_name,
        page_size=page_size, context=context, memory_bytes=memory, num_parameters=params,
        weights_format=fmt, weights_bytes=weights, bytes_per_token=bpt,
        bytes_per_request=per_request, kv_budget_bytes=budget,
        max_concurrent_requests=budget // per_request, window=layout.window,
        window_layers=len(layout.window_layers),
        bytes_per_request_full_length=pages_per_request(context, page_size) * page_size * bpt,
        window_kv_fraction=fraction,
    )


def plan_for_model(model: str, **kwargs: Any) -> KVPlan:
    """:func:`plan` for ``"default"`` (the embedded model), a ``.gguf`` file, or a local
    directory with a ``config.json`` (its safetensors headers give the parameter count when
    present; a directory with only the config is planned from the architecture)."""
    from agentlang.runtime.weights.model_loader import resolve_model

    if str(model).endswith(".gguf"):
        return _plan_for_gguf(resolve_model(model, "auto").path, **kwargs)
    path = Path(model).expanduser()
    if (path / "config.json").is_file() and not list(path.glob("*.safetensors")):
        return plan(json.loads((path / "config.json").read_text()), model=path.name, **kwargs)
    resolved = resolve_model(model)
    cfg = json.loads((resolved.path / "config.json").read_text())
    kwargs.setdefault("num_parameters", count_safetensors_parameters(resolved.path))
    return plan(cfg, model=resolved.name, **kwargs)


def _plan_for_gguf(path: Path, **kwargs: Any) -> KVPlan:
    from agentlang.runtime.weights.gguf_file import open_gguf

    gf = open_gguf(path)
    kwargs.setdefault("num_parameters", sum(math.prod(t.shape) for t in gf.tensors.values()))
    if kwargs.get("weights") is None:
        kwargs["weights_bytes"] = sum(t.nbytes for t in gf.tensors.values())
    return plan(gf.config_dict(), model=path.stem, **kwargs)


def describe_engine(engine: Any, context: int | None = None) -> dict[str, Any]:
    """KV capacity figures of a running :class:`~agentlang.runtime.engine.engine.Engine` (JSON-serialisable),
    for requests of ``context`` tokens (default: the model's maximum context)."""
    pool, layout = engine.pool, engine.kv_layout
    context = engine.max_context if context is None else context
    seen: set[int] = set()
    weights = 0
    for p in itertools.chain(engine.model.parameters(), engine.model.buffers()):
        key = id(p) if p.is_mkldnn else p.data_ptr()     # oneDNN-packed weights have no storage
        if key not in seen:   # tied embeddings count once (quantized weights are buffers)
            seen.add(key)
            weights += p.numel() * p.element_size()
    per_req = pages_per_request(context, pool.page_size)
    windows, fit = pool.windows, pool.num_pages // per_req
    if windows is not None:            # the global pages bound it, or the window pages do
        win = min(per_req, request_window_pages(layout.window, pool.page_size))
        fit = min(fit, windows.num_window_pages // win)
    return {
        "model": engine.model_name,
        "dtype": str(layout.dtype).removeprefix("torch."),
        "kv_dtype": layout.kv_dtype_name,
        "kv_bytes_per_token": layout.bytes_per_token(),
        "page_size": pool.page_size,
        "kv_pool_pages": pool.num_pages,
        "kv_pool_tokens": pool.capacity_tokens,
        "kv_pool_bytes": pool.nbytes(),
        "weights_bytes": weights,
        "context": context,
        "kv_bytes_per_request": request_bytes(layout, context, pool.page_size)[0],
        "max_concurrent_requests": fit,
        "kv_window_pages": 0 if windows is None else windows.num_window_pages,
    }
