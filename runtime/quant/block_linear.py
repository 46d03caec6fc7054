"""Linear layers over GGUF blocks as stored in the file, run by the native matmul.

Q4_0 / Q4_1 / Q8_0 weights keep their 32-weight blocks: the quant bytes (``qs``) and the fp16
scale ``d`` (and Q4_1's fp16 min ``m``) of every block, exactly the file's values; the memory
is the file's, plus a zero block that pads a row of an odd number of blocks (the kernel reads
4 blocks at a time, the last 2 if the count is not a multiple of 4). The file's bytes are
split into these tensors by :func:`agentlang.runtime.weights.gguf_weights.block_linear`; Q8_0's quant bytes are
then permuted into the kernel's order (:func:`kernel_order`, ``runtime/quant/native/qmatmul.c``).
With the AMX build of the library (``lib.isa.panels``) the same bytes and scales are stored in
panels of 16 rows instead (:func:`panel_order`, ``runtime/quant/native/avx512/panel.h``): a
permutation, the same memory but for the last panel's padding rows.
``forward`` calls :mod:`agentlang.runtime.quant.native` (activations quantized to 16 bits with a step per
32-value block; exact integer dot products per block, float32 accumulation); each output row
depends only on its own input row, so a token's logits are the same alone, batched, in a
prefill chunk of any size or in a decode step. Where the native library cannot run, the loader
uses :mod:`agentlang.runtime.quant.quant_linear` instead.

A model loaded with compute dtype bfloat16, on a CPU with bf16 instructions (AVX512-BF16 or
AMX), trades that invariance for speed on batched calls: from ``bf16_gemm_rows`` rows on
(BF16_GEMM_ROWS, above the measured crossover: ~24 rows on a Zen 5 core, where oneDNN's bf16
GEMM plus the dequantization beat the integer kernel), a call dequantizes the weight to
bfloat16 — natively, in slices, for this call only: memory stays the file's — and runs dense
bf16 GEMMs. Those rows are rounded as bf16 matmuls round, so a token's result can differ (at
bf16's precision) between a call of many rows and one of few (a decode batch of 64 against
the same sequence decoded alone). float32 models keep the bitwise row invariance unless they
ask for the same trade (:meth:`BlockLinear.use_bf16_gemms`, the engine's ``bf16_gemm_rows``):
then calls of that many rows or more (prefill chunks) round their inputs to bfloat16 and run
the GEMM, and smaller ones (decode steps, verifies) stay exact float32 native calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from agentlang.runtime.quant.native import KIND_Q4, KIND_Q8, QMatmulLibrary, QWeight

QK = 32
BF16_GEMM_ROWS = 32     # a bfloat16 model's calls from this many rows on: dense bf16 GEMMs
GEMM_SLICE_BYTES = 8 << 20    # the most of a weight dequantized at once for a bf16 GEMM


def kernel_order(qs: torch.Tensor, kind: int, inverse: bool = False) -> torch.Tensor:
    """The quant bytes ``[N, kb * bytes a block]`` (kb even) in the kernel's order
    (``runtime/quant/native/qmatmul.c``), from the file's (``inverse``: back). Q4 keeps the file's;
    Q8 stores each group of 4 blocks (the last 2 when kb % 4 == 2) as weights 0..15 of every
    block, then weights 16..31."""
    if kind == KIND_Q4:
        return qs.contiguous()
    full = qs.shape[1] // (4 * QK) * (4 * QK)                 # bytes in groups of 4 blocks

    def permute(part: torch.Tensor, blocks: int) -> torch.Tensor:
        shape = (part.shape[0], -1, 2, blocks, 16) if inverse else (part.shape[0], -1, blocks, 2, 16)
        return part.reshape(shape).transpose(2, 3).reshape(part.shape)

    return torch.cat([permute(qs[:, :full], 4), permute(qs[:, full:], 2)], dim=1).contiguous()


PANEL = 16      # weight rows a panel (the AMX build's layout, runtime/quant/native/avx512/panel.h)


def panel_order(t: torch.Tensor, words: int) -> torch.Tensor:
    """The AMX build's panels from a row-major ``[N, kb * words * 4]`` byte tensor (the
    file's quant bytes, ``words`` of 4 bytes a block) or ``[N, kb]`` float16 scales
    (``words`` 0): rows padded with zeros to whole panels of :data:`PANEL`; block b of panel p
    holds word kk of its row c at ``[p, b, kk, c]`` (scales: ``[p, b, c]``)."""
    n = t.shape[0]
    pad = -n % PANEL
    if pad:
        t = torch.cat([t, t.new_zeros(pad, t.shape[1])])
    P = t.shape[0] // PANEL
    if words == 0:
        return t.view(P, PANEL, -1).transpose(1, 2).contiguous()                  # [P, kb, 16]
    return t.view(P, PANEL, -1, words, 4).permute(0, 2, 3, 1, 4).contiguous()   # [P, kb, w, 16, 4]


def panel_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (int64 ids) of a :func:`panel_order` tensor, back in the row-major layout
    (``[T, kb * words * 4]`` bytes or ``[T, kb]`` scales)."""
    p, c = rows // PANEL, rows % PANEL
    if t.dim() == 3:
        return t[p, :, c]
    return t[p, :, :, c, :].reshape(len(rows), -1)


class BlockLinear(nn.Module):
    """``y = x @ W.T (+ b)``, ``W`` as GGUF blocks (module doc). ``forward`` takes ``x [T, K]``
    of any float dtype and returns ``[T, N]`` in that dtype (float32 is the native one)."""

    bf16_gemm_rows: int | None = None   # None: always the native kernel (module doc)
    input_dtype: torch.dtype = torch.float32
    """What the norms before it should hand over: float32 for the native kernel (no cast);
    bfloat16 in a bfloat16 model whose large calls run as bf16 GEMMs (small ones take it
    exactly as float32). :meth:`use_bf16_gemms` sets both."""

    def __init__(self, lib: QMatmulLibrary, kind: int, in_features: int, out_features: int,
                 qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None,
                 bias: torch.Tensor | None = None):
        super().__init__()
        if kind not in (KIND_Q4, KIND_Q8):
            raise ValueError(f"kind must be {KIND_Q4} (Q4_0/Q4_1) or {KIND_Q8} (Q8_0), got {kind!r}")
        if in_features % QK:
            raise ValueError(f"in_features must be a multiple of {QK}, got {in_features}")
        self.lib, self.kind = lib, kind
        self.in_features, self.out_features = in_features, out_features
        nb = in_features // QK
        pad = nb % 2                                   # a zero block: exact zeros in every sum
        bytes_per_block = QK // 2 if kind == KIND_Q4 else QK

        def padded(t: torch.Tensor | None, per_block: int) -> torch.Tensor | None:
            if t is None or pad == 0:
                return None if t is None else t.contiguous()
            return torch.cat([t, t.new_zeros(t.shape[0], pad * per_block)], dim=1).contiguous()

        # Q4: uint8 [N, kb*16]; Q8: int8 [N, kb*32]; in kernel order; scales float16 [N, kb],
        # kb = nb rounded up to even; m: Q4_1's. The AMX build (lib.isa.panels): the file's
        # bytes and the scales in panels (panel_order), [P, kb, words, 16, 4] and [P, kb, 16].
        self.panels = lib.isa.panels
        qs, d, m = padded(qs, bytes_per_block), padded(d, 1), padded(m, 1)
        if self.panels:
            words = bytes_per_block // 4
            qs, d = panel_order(qs, words), panel_order(d, 0)
            m = None if m is None else panel_order(m, 0)
        else:
            qs = kernel_order(qs, kind)
        self.register_buffer("qs", qs)
        self.register_buffer("d", d)
        self.register_buffer("m", m)
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())  # [N]
        self._qweight: tuple[tuple[int, ...], QWeight] | None = None

    def use_bf16_gemms(self, rows: int | None, model_dtype: torch.dtype) -> None:
        """Calls of ``rows`` rows or more run as bf16 GEMMs (None: never); ``model_dtype``,
        the activations' dtype, is what this layer then asks its inputs in (float32 models
        cast only the GEMM-sized calls' inputs to bfloat16, in :meth:`forward`)."""
        if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 1):
            raise ValueError(f"bf16_gemm_rows must be an integer >= 1 or None, got {rows!r}")
        self.bf16_gemm_rows = rows
        self.input_dtype = (torch.bfloat16 if rows is not None and model_dtype == torch.bfloat16
                            else torch.float32)

    @property
    def qweight(self) -> QWeight:
        """The native view of the buffers (rebuilt if a module-wide move replaced them)."""
        key = tuple(t.data_ptr() for t in (self.qs, self.d, self.m, self.bias) if t is not None)
        if self._qweight is None or self._qweight[0] != key:
            if self.d.dtype != torch.float16 or (self.m is not None and self.m.dtype != torch.float16):
                raise TypeError("BlockLinear scales must stay float16 (the file's); "
                                f"got d {self.d.dtype}")
            self._qweight = (key, QWeight.of(self.kind, self.in_features, self.qs, self.d, self.m,
                                             self.bias, n=self.out_features,
                                             kb=self.d.shape[1]))
        return self._qweight[1]

    @classmethod
    def from_blocks(cls, lib: QMatmulLibrary,
                    parts: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None]],
                    bias: torch.Tensor | None = None) -> "BlockLinear":
        """One linear from row groups ``parts`` = [(kind, qs, d, m)] concatenated by rows; all
        of one kind (Q4_0 and Q4_1 may mix: a Q4_0 part, m None, gets ``m = -8 d``)."""
        kinds = {kind for kind, *_ in parts}
        if len(kinds) != 1:
            raise ValueError("a fused linear cannot mix Q8_0 with Q4 blocks")
        kind = kinds.pop()
        qs = torch.cat([p[1] for p in parts])
        d = torch.cat([p[2] for p in parts])
        m = None
        if any(p[3] is not None for p in parts):
            m = torch.cat([p[3] if p[3] is not None else -8 * p[2] for p in parts])
        k = qs.shape[1] * (2 if kind == KIND_Q4 else 1)
        return cls(lib, kind, k, qs.shape[0], qs, d, m, bias)

    def _row_ids(self, rows: torch.Tensor | slice) -> torch.Tensor:
        """``rows`` as int64 ids (a tensor of ids, non-negative, as it is; a slice expanded)."""
        if isinstance(rows, torch.Tensor):
            return rows.long().reshape(-1)
        return torch.arange(self.out_features)[rows]

    def _scales(self, t: torch.Tensor, rows: torch.Tensor | slice) -> torch.Tensor:
        """Scales ``t`` (``d`` or ``m``) of ``rows``: float16 ``[r, kb]``."""
        return panel_rows(t, self._row_ids(rows)) if self.panels else t[rows]

    def _q(self, rows: torch.Tensor | slice) -> torch.Tensor:
        """Quant values of ``rows`` as float32 ``[r, K/32, 32]`` (Q4: 0..15, Q8: signed)."""
        nb = self.in_features // QK
        if self.panels:
            qs = panel_rows(self.qs, self._row_ids(rows))
        else:
            qs = kernel_order(self.qs[rows], self.kind, inverse=True)
        if self.kind == KIND_Q8:
            return qs.float().view(qs.shape[0], -1, QK)[:, :nb]
        b = qs.view(qs.shape[0], -1, QK // 2)[:, :nb]
        return torch.cat([b & 15, b >> 4], dim=-1).float()

    def rows(self, ids: torch.Tensor | slice) -> torch.Tensor:
        """Rows ``ids`` of the weight, dequantized exactly to float32 ``[T, K]``."""
        nb = self.in_features // QK
        q, d = self._q(ids), self._scales(self.d, ids)[:, :nb].float()[..., None]
        if self.kind == KIND_Q8:
            w = q * d
        else:
            m = None if self.m is None else self._scales(self.m, ids)[:, :nb].float()[..., None]
            w = q * d + (m if m is not None else -8 * d)
        return w.reshape(w.shape[0], self.in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as a dense ``[N, K]`` tensor."""
        return self.rows(slice(None)).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bf16_gemm_rows is not None and x.shape[0] >= self.bf16_gemm_rows:
            y = self.bf16_gemm(x.to(torch.bfloat16))
            return y if x.dtype == torch.bfloat16 else y.to(x.dtype)
        xf = x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()
        y = self.lib.matmul(self.qweight, xf, self.out_features)                 # [T, N]
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def bf16_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """x bf16 ``[M, K]`` → bf16 ``[M, N]``, over the weight dequantized for this call in
        slices of at most GEMM_SLICE_BYTES (small enough to come from the heap, not from fresh
        pages: a 57 MB lm_head in one piece cost 15 ms of page faults a call, 1 ms in slices)."""
        w, N = self.qweight, self.out_features
        bias = None if self.bias is None else self.bias.to(torch.bfloat16)
        rows = max(1, GEMM_SLICE_BYTES // (2 * self.in_features))
        if rows >= N:
            return F.linear(x, self.lib.dequantize_bf16(w), bias)
        y = torch.empty(x.shape[0], N, dtype=torch.bfloat16)
        for n0 in range(0, N, rows):
            n1 = min(N, n0 + rows)
            y[:, n0:n1] = F.linear(x, self.lib.dequantize_bf16(w, range(n0, n1)),
                                   None if bias is None else bias[n0:n1])
        return y

    def extra_repr(self) -> str:
        kind = "q8" if self.kind == KIND_Q8 else "q4"
        return f"{kind} blocks, in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"
