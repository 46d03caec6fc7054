"""The passes around an int8 GEMM in the native library (``int8.c``): a float32 or bfloat16
activation quantized to int8 per row, and the GEMM's int32 products scaled back per row and
column (:mod:`agentlang.runtime.quant.int8_linear`). Each is one pass over its rows, where
torch's ops take four to six (measured: they cost the int8 GEMM its speed-up)."""

from __future__ import annotations

import ctypes
import functools

import torch

from agentlang.runtime.quant.native import QMatmulLibrary, qmatmul_library

FLOATS = (torch.float32, torch.bfloat16)


class Int8Rows:
    """``int8.c``'s two entry points on torch tensors (contiguous, CPU)."""

    def __init__(self, lib: QMatmulLibrary):
        v, i64, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self._quantize = lib.entry("agl_quantize_rows", None, v, i, v, i64, i64, v, v, i)
        self._dequant = lib.entry("agl_dequant_rows", None, v, i64, i64, v, v, v, v, i, i)

    def quantize(self, x: torch.Tensor, mul: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[M, K]`` float32/bfloat16, times ``mul`` (float32 ``[K]``, per column) when
        given, in float32: y -> (q int8 ``[M, K]``, scale float32 ``[M]``) with
        ``scale = max|y_row| / 127``, ``q = round_half_even(y * (127 / max|y_row|))`` (a zero
        row: zeros and scale 0)."""
        if x.dim() != 2 or x.dtype not in FLOATS or x.device.type != "cpu" or not x.is_contiguous():
            raise ValueError("quantize: x must be a contiguous float32 or bfloat16 [M, K] CPU tensor")
        M, K = x.shape
        if mul is not None and (mul.shape != (K,) or mul.dtype != torch.float32
                                or not mul.is_contiguous()):
            raise ValueError(f"quantize: mul must be contiguous float32 [{K}]")
        q = torch.empty(M, K, dtype=torch.int8)
        scale = torch.empty(M, dtype=torch.float32)
        self._quantize(x.data_ptr(), int(x.dtype == torch.bfloat16),
                       None if mul is None else mul.data_ptr(), M, K, q.data_ptr(),
                       scale.data_ptr(), torch.get_num_threads())
        return q, scale

    def dequantize(self, acc: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor,
                   bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """acc int32 ``[M, N]`` -> ``float(acc) * col_scale * row_scale (+ bias)`` in float32
        (that order), returned as ``dtype`` (float32, or bfloat16 rounded to nearest even);
        scales and bias float32 ``[M]`` / ``[N]`` / ``[N]``."""
        M, N = acc.shape
        for name, t, n in (("row_scale", row_scale, M), ("col_scale", col_scale, N),
                           *((("bias", bias, N),) if bias is not None else ())):
            if t.shape != (n,) or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"dequantize: {name} must be contiguous float32 [{n}]")
        if acc.dtype != torch.int32 or not acc.is_contiguous() or dtype not in FLOATS:
            raise ValueError("dequantize: acc must be contiguous int32 and dtype float32 or bfloat16")
        out = torch.empty(M, N, dtype=dtype)
        self._dequant(acc.data_ptr(), M, N, row_scale.data_ptr(), col_scale.data_ptr(),
                      None if bias is None else bias.data_ptr(), out.data_ptr(),
                      int(dtype == torch.bfloat16), torch.get_num_threads())
        return out


@functools.cache
def int8_rows() -> Int8Rows | None:
    """The kernels where the native library runs, else None (torch's ops are used)."""
    lib = qmatmul_library()
    return None if lib is None else Int8Rows(lib)
