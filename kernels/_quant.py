"""8-bit KV caches in the kernels: quantize on store, dequantize after load.

A quantized cache holds one byte per element (``int8``, ``float8_e4m3fn`` or ``float8_e5m2``)
and a float16 scale per token and KV head, ``k_scale``/``v_scale`` [P, S, Hkv] beside
``k_cache``/``v_cache`` [P, S, Hkv, D]. The format, in fp32 arithmetic, per token and head::

    scale = fp16_rne(clamp(max_d |x[d]| / QMAX, 2**-14, 65504))
    int8:  q = clamp(round_half_even(x / scale), -127, 127)
    fp8:   q = fp8_rne(clamp(x / scale, -QMAX, QMAX))
    x'    = float(q) * float(scale)

(``agentlang.runtime.cache.kv_quant`` implements the same format in torch for the CPU path.) The narrowing
conversions are done with integer arithmetic on the fp32 bits rather than with ``.to()``: they
then round to nearest even on every target, and the Triton interpreter (whose fp8/fp16
narrowing truncates) agrees with torch bit for bit. Stored fp8 values are written through a
``uint8`` view of the cache; reads convert the fp8 dtype natively.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from agentlang.runtime.cache.kv_quant import QMAX, SCALE_DTYPE, SCALE_MAX, SCALE_MIN  # noqa: F401 (one owner)


@dataclass(frozen=True)
class QuantSpec:
    qmax: float       # largest stored magnitude
    is_fp8: bool
    mant_bits: int    # fp8 only: mantissa bits
    exp_bias: int     # fp8 only: exponent bias


def _specs() -> dict[torch.dtype, QuantSpec]:
    specs = {torch.int8: QuantSpec(QMAX["int8"], False, 0, 0)}
    if hasattr(torch, "float8_e4m3fn"):
        specs[torch.float8_e4m3fn] = QuantSpec(QMAX["fp8_e4m3"], True, 3, 7)
    if hasattr(torch, "float8_e5m2"):
        specs[torch.float8_e5m2] = QuantSpec(QMAX["fp8_e5m2"], True, 2, 15)
    return specs


QUANT_SPECS = _specs()
QUANT_DTYPES = tuple(QUANT_SPECS)


def quant_spec(cache_dtype: torch.dtype) -> QuantSpec | None:
    """The 8-bit format stored as ``cache_dtype``; None for a float (unquantized) cache."""
    return QUANT_SPECS.get(cache_dtype)


def check_scale(name: str, scale: object, cache: torch.Tensor, cache_name: str) -> None:
    """``scale`` must be given iff ``cache`` is quantized: float16 ``cache.shape[:-1]``, unit
    stride in its last dim, on the cache's device."""
    spec = quant_spec(cache.dtype)
    if spec is None:
        if scale is not None:
            raise ValueError(f"{name} is only for an 8-bit {cache_name}, which is {cache.dtype}")
        return
    if scale is None:
        raise ValueError(f"{name} is required: {cache_name} is quantized ({cache.dtype})")
    if not isinstance(scale, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != SCALE_DTYPE:
        raise ValueError(f"{name} must be {SCALE_DTYPE}, got {scale.dtype}")
    if tuple(scale.shape) != tuple(cache.shape[:-1]):
        raise ValueError(
            f"{name} must have shape {tuple(cache.shape[:-1])}, got {tuple(scale.shape)}")
    if scale.device != cache.device:
        raise ValueError(f"{name} must be on {cache.device}, got {scale.device}")
    if scale.numel() > 0 and scale.stride(-1) != 1:
        raise ValueError(
            f"{name} must have unit stride in its last dim, got strides {scale.stride()}")


def quantize_ref(x: torch.Tensor, cache_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference quantization of ``x`` [..., D]: ``(q [..., D] cache_dtype, scale [...] fp16)``."""
    spec = QUANT_SPECS[cache_dtype]
    x = x.float()
    scale = (x.abs().amax(-1) / spec.qmax).clamp(SCALE_MIN, SCALE_MAX).to(SCALE_DTYPE)
    y = (x / scale.float()[..., None]).clamp(-spec.qmax, spec.qmax)
    q = y.to(cache_dtype) if spec.is_fp8 else y.round().to(cache_dtype)
    return q, scale


def dequantize_ref(q: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """float64 values of a cache (``scale`` None: an unquantized cache)."""
    if scale is None:
        return q.double()
    return q.double() * scale.double()[..., None]


@triton.jit
def _round_mantissa(a, M: tl.constexpr):
    """fp32 bits ``a`` (int32, sign cleared) rounded to nearest even at ``M`` mantissa bits
    (carries into the exponent)."""
    SHIFT: tl.constexpr = 23 - M
    half = (1 << (SHIFT - 1)) - 1 + ((a >> SHIFT) & 1)
    return (a + half) & ~((1 << SHIFT) - 1)


@triton.jit
def _rne_small(x):
    """Round non-negative ``x`` < 2**22 to the nearest integer, ties to even."""
    return (x + 8388608.0) - 8388608.0


@triton.jit
def _fp8_bits(y, M: tl.constexpr, B: tl.constexpr):
    """Bits (uint8) of fp32 ``y`` (|y| <= the format's max) rounded to nearest even in the fp8
    format with ``M`` mantissa bits and exponent bias ``B``."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    a = bits & 0x7FFFFFFF
    ar = _round_mantissa(a, M)
    normal = ((ar >> 23) - 127 + B) * (1 << M) + ((ar >> (23 - M)) & ((1 << M) - 1))
    ay = a.to(tl.float32, bitcast=True)
    min_normal = 2.0 ** (1 - B)
    # below the smallest normal the step is fixed: count steps (2**M of them reach min_normal)
    sub = _rne_small(tl.minimum(ay, min_normal) * (2.0 ** (B - 1 + M))).to(tl.int32)
    out = tl.where(ay >= min_normal, normal, sub) + sign * 128
    return out.to(tl.uint8)


@triton.jit
def quantize_rows(x, QMAX: tl.constexpr, IS_FP8: tl.constexpr, M: tl.constexpr,
                  B: tl.constexpr):
    """``x`` [R, C] fp32 (padding lanes 0) -> (values to store [R, C] int8 or uint8 fp8 bits,
    scales [R] fp32, each exactly representable in fp16)."""
    absmax = tl.max(tl.abs(x), 1)                                           # [R]
    # correctly rounded divisions (div.rn): `/` and tl.fdiv compile to an approximate divide,
    # which misses the reference's round-to-nearest-even on exact fp8 ties
    s = tl.math.div_rn(absmax, tl.full(absmax.shape, QMAX, tl.float32))
    s = tl.minimum(tl.maximum(s, 2.0**-14), 65504.0)
    s = _round_mantissa(s.to(tl.int32, bitcast=True), 10).to(tl.float32, bitcast=True)
    y = tl.math.div_rn(x, tl.broadcast_to(s[:, None], x.shape))
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    if IS_FP8:
        q = _fp8_bits(y, M, B)
    else:
        r = _rne_small(tl.abs(y))
        q = tl.where(y < 0, -r, r).to(tl.int8)
    return q, s
