"""Weight-only quantized linear layers and embeddings for CPU (GGUF weights kept quantized).

Two storage formats, each with one matmul kernel from torch's CPU build:

* **int4, groupwise** (``group`` = 32 input features): ``w = (q - 8) * scale + zero`` with
  ``q`` in 0..15, ``scale``/``zero`` per (row, group). GGUF Q4_0 maps onto it with ``zero = 0``,
  Q4_1's per-32 ``(d, m)`` with ``scale = d``, ``zero = m + 8 d`` — no re-quantization.
  Matmul: ``aten._weight_int4pack_mm_for_cpu`` (bf16 activations + bf16 scales: the fast path).
* **int8, per output row**: ``w = q * scale``. GGUF Q8_0 (per-32 fp16 scales) is re-scaled to
  one scale per row (the kernel has no groups). Matmul: ``aten._weight_int8pack_mm``.

Every call, whatever its number of rows, runs the quantized kernel: each output row of these
kernels depends only on its own input row (tested), so a token's logits are the same alone,
batched, in a prefill chunk of any size or in a decode step — greedy outputs do not change with
cache state, batching or chunking. (A dense GEMM over dequantized weights would be faster for
long prefills but rounds differently from the kernel, and near-ties then flip between a cold
and a warm cache.) Matmuls run in bf16; the result is cast back to the input's dtype.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

GROUP = 32          # GGUF block size = int4 group size
COMPUTE_DTYPE = torch.bfloat16   # the kernels' activation dtype (their fast path)
_PACK_ROWS = 4096   # rows packed at a time (the packing op takes int32 [N, K]: 4 bytes a weight)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q: uint8 ``[N, K]`` in 0..15 → torch's CPU int4 pack ``[N, K/2]`` uint8.

    The pack is laid out in independent blocks of :func:`pack_block_rows` rows, so it is built a
    few thousand rows at a time (the op wants int32 input) and concatenated; a tail of
    ``N % pack_block_rows()`` rows is its own block.
    """
    N, K = q.shape
    if N % 16 or K % GROUP:
        raise ValueError(f"int4 packing needs rows % 16 == 0 and columns % {GROUP} == 0, got {N}x{K}")
    parts = [torch.ops.aten._convert_weight_to_int4pack_for_cpu(q[i:i + _PACK_ROWS].to(torch.int32), 1)
             for i in range(0, N, _PACK_ROWS)]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


@functools.cache
def pack_block_rows() -> int:
    """Rows of one block of torch's CPU int4 pack on this CPU: 64 where torch's kernels use
    AVX-512, 32 with AVX2 (read off the op itself: :func:`pack_int4` of a probe with one nonzero
    nibble, row 32's, which shares byte 0 with row 0 only in 64-row blocks)."""
    probe = torch.zeros(64, GROUP, dtype=torch.uint8)
    probe[32, 0] = 1
    return 64 if int(pack_int4(probe).reshape(-1)[0]) == 16 else 32


def unpack_int4(packed: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: ``[N, K/2]`` uint8 → ``[N, K]`` uint8 in 0..15.

    torch's CPU layout, with ``BN`` = :func:`pack_block_rows`: each full block of ``BN`` rows is
    ``[K, BN/2]`` bytes whose low nibbles hold rows 0..BN/2-1 and high nibbles the rest; the
    tail block of ``n = N % BN`` rows is ``[K, n/2]`` bytes holding rows (2j, 2j+1) in (low,
    high) nibbles of byte j.
    """
    bn = pack_block_rows()
    flat = packed.reshape(-1)
    full = (N // bn) * bn
    out = []
    if full:
        b = flat[: full * K // 2].view(N // bn, K, bn // 2)                    # [B, K, BN/2]
        q = torch.stack([b & 15, b >> 4], dim=1)                               # [B, 2, K, BN/2]
        out.append(q.permute(0, 1, 3, 2).reshape(full, K))
    n = N - full
    if n:
        b = flat[full * K // 2:].view(K, n // 2)                               # [K, n/2]
        q = torch.stack([b & 15, b >> 4], dim=-1).reshape(K, n)                # [K, n]
        out.append(q.t())
    return torch.cat(out) if len(out) > 1 else out[0]


class QuantLinear(nn.Module):
    """``y = x @ W.T (+ b)`` with ``W`` stored as int4 groupwise or int8 per-row (see module doc).

    Build with :meth:`from_int4` or :meth:`from_int8`. ``forward`` takes ``x [T, K]`` of any
    float dtype and returns ``[T, N]`` in that dtype.
    """

    input_dtype = COMPUTE_DTYPE     # what the norms before it should hand over (no cast)

    def __init__(self, kind: str, in_features: int, out_features: int, weight: torch.Tensor,
                 scales: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if kind not in ("int4", "int8"):
            raise ValueError(f"kind must be 'int4' or 'int8', got {kind!r}")
        self.kind, self.in_features, self.out_features = kind, in_features, out_features
        self.register_buffer("weight", weight)     # int4: [Np, K/2] packed; int8: [N, K]
        self.register_buffer("scales", scales)     # int4: [K/32, Np, 2] (scale, zero); int8: [N]
        # (int4: Np = N rounded up to 16; the padding rows are zero and sliced off)
        self.register_buffer("bias", bias)         # [N] in bf16, or None

    @classmethod
    def from_int4(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                  bias: torch.Tensor | None = None) -> "QuantLinear":
        """q: uint8 ``[N, K]`` in 0..15; scale, zero: ``[N, K/32]`` (w = (q - 8) * scale + zero)."""
        N, K = q.shape
        pad = -N % 16                      # the kernel packs rows in 16s: pad with zero rows
        if pad:
            q = torch.cat([q, q.new_full((pad, K), 8)])
            scale, zero = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (scale, zero))
        sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).to(torch.bfloat16).contiguous()
        return cls("int4", K, N, pack_int4(q), sz, _bf16(bias))

    @classmethod
    def from_int8(cls, q: torch.Tensor, scale: torch.Tensor,
                  bias: torch.Tensor | None = None) -> "QuantLinear":
        """q: int8 ``[N, K]``; scale: ``[N]`` (w = q * scale)."""
        N, K = q.shape
        return cls("int8", K, N, q.contiguous(), scale.to(torch.bfloat16), _bf16(bias))

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The weight as a dense ``[N, K]`` tensor (for ``weights="dense"`` and checks)."""
        N, K = self.out_features, self.in_features
        if self.kind == "int8":
            return self.weight.to(dtype) * self.scales.to(dtype)[:, None]
        Np = self.weight.shape[0]
        q = unpack_int4(self.weight, Np, K)[:N].view(N, K // GROUP, GROUP).to(dtype)
        s = self.scales[:, :N].to(dtype).permute(1, 0, 2)                          # [N, K/32, 2]
        return ((q - 8) * s[..., :1] + s[..., 1:]).reshape(N, K)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the weight, dequantized: ``[T, K]``, float32 (int8: exact) or bf16."""
        if self.kind == "int8":
            return self.weight[ids].float() * self.scales[ids].float()[:, None]
        return int4_rows(self, ids)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (dtype checks in Python: a no-op conversion still costs a dispatch, ~1 µs a call)
        xb = x if x.dtype == COMPUTE_DTYPE else x.to(COMPUTE_DTYPE)                # [T, K]
        if self.kind == "int4":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.weight, GROUP, self.scales)
            if y.shape[1] != self.out_features:
                y = y[:, :self.out_features]
        else:
            y = torch.ops.aten._weight_int8pack_mm(xb, self.weight, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y if y.dtype == x.dtype else y.to(x.dtype)                           # [T, N]

    def extra_repr(self) -> str:
        return f"{self.kind}, in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


class QuantEmbedding(nn.Module):
    """Row lookup into a quantized weight ``[V, H]`` (a :class:`QuantLinear` or a
    :class:`~agentlang.runtime.quant.block_linear.BlockLinear`, whose ``rows(ids)`` dequantizes rows; tied
    embeddings share it with the LM head) — only the looked-up rows are ever dequantized."""

    def __init__(self, table: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.table = table
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.rows(ids).to(self.dtype)                                 # [T, H]


def int4_rows(t: QuantLinear, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of an int4 :class:`QuantLinear`'s weight, dequantized to bf16 ``[T, K]``
    (reads the packed layout described in :func:`unpack_int4`)."""
    N, K = t.weight.shape[0], t.in_features          # N: packed rows (padding included)
    bn = pack_block_rows()
    full = (N // bn) * bn
    flat = t.weight.reshape(-1)
    q = torch.empty(ids.shape[0], K, dtype=torch.uint8)
    main = ids < full
    if bool(main.any()):
        b = flat[: full * K // 2].view(N // bn, K, bn // 2)                        # [B, K, BN/2]
        r = ids[main]
        byte = b[r // bn, :, r % (bn // 2)]                                        # [t, K]
        q[main] = torch.where((r % bn < bn // 2)[:, None], byte & 15, byte >> 4)
    if not bool(main.all()):
        tb = flat[full * K // 2:].view(K, (N - full) // 2)                          # [K, n/2]
        r = ids[~main] - full
        byte = tb[:, r // 2].t()                                                   # [t, K]
        q[~main] = torch.where((r % 2 == 0)[:, None], byte & 15, byte >> 4)
    s = t.scales[:, ids].permute(1, 0, 2)                                          # [T, K/32, 2]
    qf = q.view(-1, K // GROUP, GROUP).to(torch.bfloat16)
    return ((qf - 8) * s[..., :1] + s[..., 1:]).reshape(-1, K)


def _bf16(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to(torch.bfloat16).contiguous()
