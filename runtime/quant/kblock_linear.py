"""Linear layers over K-quant super-blocks, and over row parts of different kinds, run by the
native matmul (the builds with K-quant kernels: ``Isa.kquants``).

:class:`KBlockLinear` keeps one Q4_K / Q5_K / Q6_K weight as :class:`~agentlang.runtime.quant.kquant.KBlocks`
(the file's values, repacked: ``runtime/quant/native/avx2/kquant.h``; memory in
:mod:`~agentlang.runtime.quant.kquant`; with the AMX build, Q4_K, Q6_K and Q5_0 / Q5_1 in
that build's panels of 16 rows: ``avx512/panel.h``), and Q5_0 / Q5_1 blocks the same way. :class:`ChainLinear` is one
fused linear whose row parts have different kinds — a Q4_K_M file stores ``attn_v`` of some
layers in Q6_K beside Q4_K ``attn_q`` / ``attn_k`` — as a chain of native weights that one call
multiplies (the activations quantized once, each part filling its own output columns).
Both inherit :class:`~agentlang.runtime.quant.block_linear.BlockLinear`'s contract: float32
native arithmetic, each output row a function of its input row alone (alone, batched, any
chunk, any thread count), so the one-call decode layer takes them as it takes Q4_0 / Q8_0;
and its bf16-GEMM path (``bf16_gemm_rows``, a bfloat16 model's larger calls on a CPU with bf16
instructions: the weight dequantized natively to bfloat16 for the call, in slices).
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch
from torch import nn

from agentlang.runtime.quant.block_linear import PANEL, BlockLinear, panel_order, panel_rows
from agentlang.runtime.quant.kquant import QK_K, KBlocks, dequantize
from agentlang.runtime.quant.native import KIND_Q4_K, KIND_Q5, KIND_Q6_K, QMatmulLibrary, QWeight


def _needs_kquants(lib: QMatmulLibrary) -> None:
    if not lib.isa.kquants:
        raise ValueError(f"the {lib.isa.name} build of the native library has no K-quant kernels")


def _q6_halves(sc: torch.Tensor, inverse: bool) -> torch.Tensor:
    """Q6_K's scales ``[N, K/16]`` from kquant.h's order (a group of 4 blocks: their first
    halves, then their second) to a block's two halves in turn (``inverse``: back)."""
    shape = (sc.shape[0], -1, 4, 2) if inverse else (sc.shape[0], -1, 2, 4)
    return sc.reshape(shape).transpose(2, 3).reshape(sc.shape).contiguous()


def _q5_masks(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0 / Q5_1's bit 4, the file's ``qh`` ``[N, nb * 4]`` (bit j of a block's 4 bytes:
    weight j), as panel.h's masks ``[P, nb, 8, 8]``: for the block's unpacked word-row kk
    (weights 4 kk .. 4 kk + 3), 64 bits, bit 4 c + e of them weight 4 kk + e of panel row c."""
    n = qh.shape[0]
    bits = np.unpackbits(qh.numpy().reshape(n, -1, 4), axis=-1, bitorder="little")  # [N, nb, 32]
    nb = bits.shape[1]
    bits = np.concatenate([bits, np.zeros((-n % PANEL, nb, 32), np.uint8)])         # whole panels
    panels = bits.reshape(-1, PANEL, nb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(-1, nb, 8, 64)
    return torch.from_numpy(np.packbits(panels, axis=-1, bitorder="little"))         # [P, nb, 8, 8]


def _q5_bits(masks: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """:func:`_q5_masks` back, for panel rows ``rows``: the file's ``qh`` ``[T, nb * 4]``."""
    mine = masks[rows // PANEL].numpy()                      # [T, nb, 8, 8]: the rows' panels
    bits = np.unpackbits(mine, axis=-1, bitorder="little").reshape(*mine.shape[:3], PANEL, 4)
    bits = bits[np.arange(len(rows)), :, :, (rows % PANEL).numpy()]                   # [T, nb, 8, 4]
    packed = np.packbits(bits.reshape(len(rows), -1, 32), axis=-1, bitorder="little")
    return torch.from_numpy(np.ascontiguousarray(packed).reshape(len(rows), -1))


class KBlockLinear(BlockLinear):
    """``y = x @ W.T (+ b)``, ``W`` a K-quant weight (module doc)."""

    def __init__(self, lib: QMatmulLibrary, blocks: KBlocks, bias: torch.Tensor | None = None):
        nn.Module.__init__(self)
        _needs_kquants(lib)
        multiple = 64 if blocks.kind == KIND_Q5 else QK_K
        if blocks.in_features % multiple:
            raise ValueError(f"rows must hold a multiple of {multiple} weights for kind "
                             f"{blocks.kind}, got {blocks.in_features}")
        self.lib, self.kind = lib, blocks.kind
        self.in_features, self.out_features = blocks.in_features, blocks.qs.shape[0]
        # the AMX build keeps Q4_K, Q6_K and Q5_0 / Q5_1 in panels of 16 rows (avx512/panel.h):
        # qs as Q4's (Q6_K: Q8's), the per-super-block d, dmin and the per-block sc, mn (Q5: d,
        # m) as panel_order'ed scales (Q6_K's sc a block's two halves, not a group's A then B
        # halves; Q5's hb bit 4 as masks of the unpacked word-rows)
        self.panels = lib.isa.panels and blocks.kind in (KIND_Q4_K, KIND_Q6_K, KIND_Q5)
        words = 8 if blocks.kind == KIND_Q6_K else 4
        sc, hb = blocks.sc, blocks.hb
        if self.panels and blocks.kind == KIND_Q6_K:
            sc = _q6_halves(sc, inverse=False)
        for name, t, w in (("qs", blocks.qs, words), ("d", blocks.d, 0), ("sc", sc, 0),
                           ("mn", blocks.mn, 0), ("m", blocks.dmin, 0)):
            if t is not None:
                t = panel_order(t.contiguous(), w) if self.panels else t.contiguous()
            self.register_buffer(name, t)
        if self.panels and hb is not None:
            hb = _q5_masks(hb)
        self.register_buffer("hb", None if hb is None else hb.contiguous())
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())
        self._qweight = None

    @property
    def blocks(self) -> KBlocks:
        """The weight in :class:`KBlocks`' row layout (a copy where it is kept in panels)."""
        return self._row_blocks(slice(None))

    def _row_blocks(self, ids: torch.Tensor | slice) -> KBlocks:
        if not self.panels:
            return KBlocks(self.kind, self.qs, self.d, self.m, self.sc, self.mn,
                           self.hb).rows(ids)
        r = self._row_ids(ids)
        pick = lambda t: None if t is None else panel_rows(t, r)       # noqa: E731
        sc = pick(self.sc)
        if self.kind == KIND_Q6_K:
            sc = _q6_halves(sc, inverse=True)
        hb = None if self.hb is None else _q5_bits(self.hb, r)
        return KBlocks(self.kind, pick(self.qs), pick(self.d), pick(self.m), sc, pick(self.mn), hb)

    @property
    def qweight(self) -> QWeight:
        key = tuple(t.data_ptr() for t in (self.qs, self.d, self.m, self.sc, self.mn, self.hb,
                                           self.bias) if t is not None)
        if self._qweight is None or self._qweight[0] != key:
            self._qweight = (key, QWeight.of(self.kind, self.in_features, self.qs, self.d, self.m,
                                             self.bias, self.sc, self.mn, self.hb,
                                             n=self.out_features))
        return self._qweight[1]

    def rows(self, ids: torch.Tensor | slice) -> torch.Tensor:
        """Rows ``ids`` of the weight, dequantized exactly to float32 ``[T, K]``."""
        return dequantize(self._row_blocks(ids))

    def extra_repr(self) -> str:
        kind = {KIND_Q5: "q5 blocks"}.get(self.kind, f"kind {self.kind} super-blocks")
        return f"{kind}, in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


class ChainLinear(BlockLinear):
    """One linear whose row parts are native weights of different kinds (module doc)."""

    def __init__(self, lib: QMatmulLibrary, parts: list[BlockLinear]):
        nn.Module.__init__(self)
        _needs_kquants(lib)
        ks = {(p.in_features, p.qweight.kb) for p in parts}
        if len(ks) != 1:
            raise ValueError(f"chained parts need one input width and block count, got {sorted(ks)}")
        self.lib, self.kind = lib, parts[0].kind
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self._qweight = None

    @property
    def qweight(self) -> QWeight:
        """The head of the chain: copies of the parts' weights, each copy's ``next`` the
        following copy (the parts' own stay unchained: each still runs alone)."""
        heads = [p.qweight for p in self.parts]
        key = tuple(id(h) for h in heads)
        if self._qweight is None or self._qweight[0] != key:
            links = [QWeight.from_buffer_copy(h) for h in heads]
            for h, nxt in zip(links, links[1:] + [None]):
                h.next = None if nxt is None else ctypes.addressof(nxt)
            self._qweight = (key, links[0], links)     # the copies live as long as the key
        return self._qweight[1]

    def bf16_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """Each part's bf16 GEMM, side by side (a part's weight is one kind to dequantize)."""
        return torch.cat([p.bf16_gemm(x) for p in self.parts], dim=1)

    def rows(self, ids: torch.Tensor | slice) -> torch.Tensor:
        return torch.cat([p.rows(slice(None)) for p in self.parts])[ids]

    def extra_repr(self) -> str:
        return f"chain of {len(self.parts)} parts, in={self.in_features}, out={self.out_features}"
