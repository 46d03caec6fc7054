"""KV cache storage formats: the model's dtype, bfloat16, or 8 bits per element plus a scale.

``kv_dtype`` names the format: ``auto`` stores K/V in the model's dtype (no scales);
``bfloat16`` stores them as bfloat16 whatever the model's dtype (no scales: each value rounded
to nearest even once, as it is stored, and widened exactly when read — half a float32 model's
KV bytes, llama.cpp's f16 cache's size); ``int8``, ``fp8_e4m3`` and ``fp8_e5m2`` store each
element in one byte, together with one float16 scale per token and KV head.

Why per-token-per-head scales (and not per page): a token's K/V are written once, when the
token is stored, and never change afterwards. A per-page scale would have to grow whenever a
later token of the same page (decode fills a page one token at a time) exceeds it, forcing a
requantization of the page's earlier tokens — impossible once the page is shared read-only by
the prefix cache or by copy-on-write forks. A per-token scale costs 2 bytes per head next to
``head_dim`` bytes of data (3% at ``head_dim`` 64), and adapts to each token's range
(attention-sink tokens have much larger K than the rest). fp16 scales (not fp32) keep int8 at
``(D + 2) / 2D`` of an fp16 cache: 0.516 at ``D = 64``.

The format, in fp32 arithmetic (the Triton store kernel computes exactly the same)::

    absmax = max_d |x[d]|                          over head_dim, per token and head
    scale  = fp16(clamp(absmax / QMAX, 2**-14, 65504))     (round to nearest even)
    int8:  q = clamp(round_half_even(x / scale), -127, 127)
    fp8:   q = fp8(clamp(x / scale, -QMAX, QMAX))           (round to nearest even)
    x'     = float(q) * float(scale)                          (dequantized)

``QMAX`` is 127 for int8, 448 for e4m3 and 57344 for e5m2 (each format's largest finite value),
so a token's largest element always lands on the format's largest magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KV_DTYPES = ("auto", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2")
FLOAT_STORAGE = {"bfloat16": torch.bfloat16}   # unscaled storage in a dtype of its own
SCALE_DTYPE = torch.float16
SCALE_MIN = 2.0**-14          # smallest normal float16: the scale of an all-zero vector
SCALE_MAX = 65504.0           # largest float16
TORCH_NAMES = {"int8": "int8", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
QMAX = {"int8": 127.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}   # each format's largest value


@dataclass(frozen=True)
class KVFormat:
    """An 8-bit KV storage format."""

    name: str               # "int8" | "fp8_e4m3" | "fp8_e5m2"
    storage: torch.dtype    # torch.int8 | torch.float8_e4m3fn | torch.float8_e5m2
    qmax: float             # largest stored magnitude; scale = absmax / qmax

    @property
    def is_float(self) -> bool:
        return self.name.startswith("fp8")


def kv_format(kv_dtype: str) -> KVFormat | None:
    """The 8-bit storage format named ``kv_dtype``; None for ``auto`` (the model's dtype) and
    ``bfloat16`` (:data:`FLOAT_STORAGE`: no scales).

    Raises ``ValueError`` for an unknown name (listing the accepted ones) and for an fp8 format
    this torch build has no dtype for."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {list(KV_DTYPES)}, got {kv_dtype!r}")
    if kv_dtype == "auto" or kv_dtype in FLOAT_STORAGE:
        return None
    storage = getattr(torch, TORCH_NAMES[kv_dtype], None)
    if storage is None:
        raise ValueError(
            f"kv_dtype {kv_dtype!r} needs torch.{TORCH_NAMES[kv_dtype]}, which torch "
            f"{torch.__version__} does not provide; use 'int8' or 'auto'"
        )
    return KVFormat(kv_dtype, storage, QMAX[kv_dtype])


def kv_dtype_name(kv_dtype: str, model_dtype: torch.dtype) -> str:
    """The effective storage name: ``auto`` resolves to the model dtype (``"bfloat16"``...)."""
    kv_format(kv_dtype)  # validates
    return str(model_dtype).removeprefix("torch.") if kv_dtype == "auto" else kv_dtype


def quantize(x: torch.Tensor, fmt: KVFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [..., D] (any float dtype) -> ``(q [..., D] in fmt.storage, scale [...] fp16)``."""
    x = x.float()
    absmax = x.abs().amax(dim=-1)                                          # [...]
    scale = (absmax / fmt.qmax).clamp(SCALE_MIN, SCALE_MAX).to(SCALE_DTYPE)
    y = x / scale.float().unsqueeze(-1)
    if fmt.is_float:
        q = y.clamp(-fmt.qmax, fmt.qmax).to(fmt.storage)
    else:
        q = y.round().clamp(-fmt.qmax, fmt.qmax).to(fmt.storage)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q`` [..., D], ``scale`` [...] -> ``[..., D]`` in ``dtype`` (computed in fp32)."""
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)


def check_kv_dtype_support(kv_dtype: str, device: torch.device, attention_backend: str) -> None:
    """Raise ``ValueError`` when ``device`` (with ``attention_backend``, ``"auto"`` resolving
    to triton on CUDA) cannot store and read ``kv_dtype``."""
    fmt = kv_format(kv_dtype)
    backend = attention_backend
    if backend == "auto":
        backend = "triton" if device.type == "cuda" else "torch"
    if kv_dtype in FLOAT_STORAGE and backend != "torch":
        raise ValueError(f"kv_dtype {kv_dtype!r} is read by the torch attention backend only "
                         f"(attention_backend 'torch' or 'auto' on CPU), got {backend!r}; use "
                         f"'auto' (the model's dtype) or 'int8'")
    if fmt is None:
        return
    if backend == "triton" and device.type == "cuda" and kv_dtype == "fp8_e4m3":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):  # Triton's fp8e4nv needs sm_89+
            raise ValueError(
                f"kv_dtype 'fp8_e4m3' needs a GPU of compute capability >= 8.9 for the Triton "
                f"kernels (this one is {major}.{minor}); use 'fp8_e5m2' or 'int8'"
            )
    try:  # the casts the torch path runs: quantize, store, dequantize
        probe = torch.ones(2, 4, device=device)
        q, s = quantize(probe, fmt)
        dequantize(q, s, torch.float32).sum().item()
    except (RuntimeError, TypeError, NotImplementedError, AssertionError) as e:
        raise ValueError(
            f"kv_dtype {kv_dtype!r} is not supported on device {device}: "
            f"{type(e).__name__}: {e}"
        ) from None
