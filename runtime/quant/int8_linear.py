"""Linears with int8 weights and int8 activations (``weights="int8"``: W8A8, dynamic).

Each weight row (an output channel) is quantized once, at load, to int8 with its own scale
(``scale = max|w_row| / 127``, symmetric); each activation row (a token) is quantized the same
way on every call. The products are exact int32 sums (oneDNN's int8 GEMM,
VNNI where the CPU has it; :func:`int8_gemm`), scaled back by the row's and the column's scale in float32:

    y[t, n] = float(sum_k qx[t, k] qw[n, k]) * sw[n] * sx[t]  (+ bias[n])

Why: on a 2-core Zen 4 EPYC (AVX-512 VNNI) oneDNN's int8 GEMM runs the embedded model's
shapes at ~700–830 GOP/s against ~260–400 GFLOP/s for its bf16 GEMM on the packed weights, and
the weights take half bf16's memory (issue 29). The cost is precision: two int8 roundings per
product. Smoothed (SmoothQuant, :mod:`~agentlang.runtime.models.int8_calibration`), the
embedded model's next-token agreement with its float32 self is 0.955 (mean KL 0.011) against
0.983 (0.0008) for bf16 and 0.979 (0.0015) for Q4_1 on torch's int4 kernel
(``bench/cpu_local.py --skip speed --models int8``: 50 prompts x 128 positions).

A token's result depends on its own row only, and integer sums are exact, so a linear's output
row is **bitwise** the same alone or batched: greedy outputs batched equal those alone. What
int8 does amplify are the last-bit differences attention has between a whole prefill and a
chunked one, or a cached prefix and a recomputed one: one activation that lands on the other
side of an int8 rounding step moves the logits by far more than float32's rounding does, so
near-ties can flip with cache state and chunking (measured: 8/8 sequences batched = alone, 7/8
warm = cold, 2–4/8 chunked by 8 tokens = whole, 3–4/8 preempted = not; the trade ``auto``
makes in bfloat16). The quantize and rescale passes run natively
(:mod:`agentlang.runtime.quant.native.int8_rows`) or, without the library, as torch ops with
the same formulas.
"""

from __future__ import annotations

import torch
from torch import nn

from agentlang.runtime.quant.native.int8_rows import FLOATS, int8_rows


def int8_gemm_available() -> bool:
    """Whether this torch build has the int8 GEMM op (aten's ``_int_mm``, what
    ``torch._int_mm`` calls: int8 ``[M, K] @ [K, N]`` -> exact int32)."""
    return hasattr(torch.ops.aten, "_int_mm")


def int8_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 ``a [M, K] @ b [K, N]`` -> int32 ``[M, N]``, exact (oneDNN's int8 GEMM on CPU)."""
    return torch.ops.aten._int_mm(a, b)


def quantize_rows(x: torch.Tensor, mul: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x ``[M, K]`` float32/bfloat16 (times ``mul``, float32 ``[K]`` per column, when given:
    y) -> (int8 ``[M, K]``, float32 scale ``[M]``), per row, symmetric:
    ``q = round_half_even(y * (127 / max|y_row|))``, ``scale = max|y_row| / 127``; a zero row
    gives zeros and scale 0."""
    kernels = int8_rows()
    if kernels is not None and x.device.type == "cpu":
        return kernels.quantize(x.contiguous(), mul)
    xf = x.float() if mul is None else x.float() * mul
    a = xf.abs().amax(-1)                                                   # [M]
    ok = a > 0
    inv = torch.where(ok, torch.full_like(a, 127.0) / torch.where(ok, a, 1.0), 0.0)  # a division
    q = torch.round(xf * inv[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, torch.where(ok, a / 127.0, 0.0)


def dequantize(acc: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor,
               bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """int32 ``[M, N]`` -> ``float(acc) * col_scale * row_scale (+ bias)`` as ``dtype``."""
    kernels = int8_rows()
    if kernels is not None and acc.device.type == "cpu":
        return kernels.dequantize(acc, row_scale, col_scale, bias, dtype)
    y = acc.float() * col_scale * row_scale[:, None]
    return (y if bias is None else y + bias).to(dtype)


ALPHA = 0.5     # SmoothQuant's migration strength (agentlang.runtime.models.int8_calibration)


def smoothing(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SmoothQuant's ``s_k = a_k ** ALPHA / max|W[:, k]| ** (1 - ALPHA)``, float32 ``[in]``,
    from input ranges ``a [in]`` (:mod:`~agentlang.runtime.models.int8_calibration`) and
    ``weight [out, in]``."""
    w = weight.detach().float().abs().amax(0)
    return a.clamp_min(1e-5).pow(ALPHA) / w.clamp_min(1e-5).pow(1 - ALPHA)


class Int8Linear(nn.Module):
    """``y = x @ W.T + b`` with W and x in int8 (module doc). x: ``[..., in]`` float32 or
    bfloat16 on the CPU -> ``[..., out]`` in x's dtype."""

    def __init__(self, linear: nn.Linear, smooth: torch.Tensor | None = None):
        """``smooth``: SmoothQuant's ``s [in]`` (:func:`smoothing`):
        W's columns are scaled by it before quantization, x's divided by it on every call."""
        super().__init__()
        w = linear.weight.detach()
        if w.device.type != "cpu" or not w.dtype.is_floating_point:
            raise ValueError(f"Int8Linear takes a floating-point CPU weight, got {w.dtype} on "
                             f"{w.device}")
        if not int8_gemm_available():
            raise RuntimeError("weights='int8' needs torch's int8 GEMM (aten::_int_mm), which "
                               "this torch build lacks")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = w.float() if smooth is None else w.float() * smooth.float()
        q, s = quantize_rows(w.contiguous())
        self.register_buffer("qweight", q, persistent=False)                 # int8 [out, in]
        self.register_buffer("scale", s, persistent=False)                   # float32 [out]
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self.register_buffer("bias", bias, persistent=False)                 # float32 [out]
        inv = None if smooth is None else (1.0 / smooth.float()).contiguous()
        self.register_buffer("inv_smooth", inv, persistent=False)            # float32 [in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in FLOATS:
            raise ValueError(f"Int8Linear takes float32 or bfloat16 inputs, got {x.dtype}")
        lead = x.shape[:-1]
        qx, sx = quantize_rows(x.reshape(-1, self.in_features), self.inv_smooth)
        acc = int8_gemm(qx, self.qweight.t())                            # int32 [T, out]
        return dequantize(acc, sx, self.scale, self.bias, x.dtype).view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def int8_linears(model: nn.Module, ranges: dict[nn.Linear, torch.Tensor] | None = None) -> int:
    """Replace every CPU ``nn.Linear`` of ``model`` (the LM head included; a tied one gets its
    own int8 copy, the embedding table stays) by an :class:`Int8Linear`, smoothed where
    ``ranges`` (:func:`~agentlang.runtime.models.int8_calibration.input_ranges`) has the
    linear's input range; returns how many were replaced."""
    ranges = ranges or {}
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children()
               if type(child) is nn.Linear and child.weight.device.type == "cpu"]
    for parent, name, child in targets:
        a = ranges.get(child)
        setattr(parent, name, Int8Linear(child, None if a is None else smoothing(a, child.weight)))
    return len(targets)

