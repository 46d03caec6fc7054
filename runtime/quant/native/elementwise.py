"""The bfloat16 layer's element-wise steps in the native library (``glue.c``): RMSNorm (with
the residual add before it), SwiGLU's ``silu(gate) * up`` and RoPE, one pass each instead of torch's
chain of casts and ops (issue 29: ~15 % of a bf16 step on 2 cores). The arithmetic is torch's
(float32 inside, bf16 rounding where torch rounds); see the C file for what can differ."""

from __future__ import annotations

import ctypes
import functools

import torch

from agentlang.runtime.quant.native import QMatmulLibrary, qmatmul_library


class Elementwise:
    """``glue.c``'s entry points on torch tensors (bfloat16, contiguous, CPU)."""

    def __init__(self, lib: QMatmulLibrary):
        v, i64, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self._norm = lib.entry("agl_rmsnorm_bf16", None, v, v, v, i64, i64, ctypes.c_float, v, i)
        self._silu = lib.entry("agl_silu_mul_bf16", None, v, i64, i64, v, i)
        self._rope = lib.entry("agl_rope_bf16", None, v, i64, i64, i64, i64, v, v, v, i)

    @staticmethod
    def applies(*ts: torch.Tensor) -> bool:
        """Whether every tensor is a contiguous bfloat16 CPU tensor (what the kernels take)."""
        return all(t.dtype == torch.bfloat16 and t.device.type == "cpu" and t.is_contiguous()
                   for t in ts)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """``weight * bf16(x * rsqrt(mean(x^2) + eps))`` over the last dim of x ``[..., n]``;
        with ``residual`` (x's shape), first ``x += residual`` **in place**. Returns a new
        tensor; all bfloat16."""
        if not self.applies(x, weight, *(() if residual is None else (residual,))):
            raise ValueError("rmsnorm: x, weight (and residual) must be contiguous bfloat16 on the CPU")
        n = x.shape[-1]
        if weight.shape != (n,) or (residual is not None and residual.shape != x.shape):
            raise ValueError(f"rmsnorm: weight must be [{n}] and residual {tuple(x.shape)}")
        out = torch.empty_like(x)
        self._norm(x.data_ptr(), None if residual is None else residual.data_ptr(),
                   weight.data_ptr(), x.numel() // n, n, eps, out.data_ptr(),
                   torch.get_num_threads())
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``bf16(silu(gate)) * up`` for ``gate_up [T, 2I]`` (gate first) -> ``[T, I]``."""
        if not self.applies(gate_up) or gate_up.dim() != 2 or gate_up.shape[1] % 2:
            raise ValueError("silu_mul: gate_up must be contiguous bfloat16 [T, 2I] on the CPU")
        T, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(T, inter, dtype=torch.bfloat16)
        self._silu(gate_up.data_ptr(), T, inter, out.data_ptr(), torch.get_num_threads())
        return out

    def rope(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """``RotaryEmbedding.rotate`` of x ``[T, H, d]`` (each token's heads contiguous, its
        rows any stride apart: a slice of the fused qkv) by tables ``[T, 1, d]`` -> a new
        contiguous ``[T, H, d]``."""
        T, H, d = x.shape
        if (not self.applies(cos, signed_sin) or x.dtype != torch.bfloat16 or x.device.type != "cpu"
                or x.stride(2) != 1 or x.stride(1) != d or cos.shape != (T, 1, d)
                or signed_sin.shape != cos.shape):
            raise ValueError("rope: x [T, H, d] (heads contiguous) and tables [T, 1, d], bfloat16")
        out = torch.empty(T, H, d, dtype=torch.bfloat16)
        self._rope(x.data_ptr(), T, H, d, x.stride(0), cos.data_ptr(), signed_sin.data_ptr(),
                   out.data_ptr(), torch.get_num_threads())
        return out


@functools.cache
def elementwise() -> Elementwise | None:
    """The kernels where the native library runs, else None (torch's ops are used)."""
    lib = qmatmul_library()
    return None if lib is None else Elementwise(lib)
