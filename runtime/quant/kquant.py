"""K-quant super-blocks (Q4_K, Q5_K, Q6_K) and Q5_0 / Q5_1 blocks kept quantized: the file's
values repacked into the layout the native kernel reads (``runtime/quant/native/avx2/kquant.h``)
and decoded back exactly. Memory: the file's, + 4 bytes a super-block for Q4_K / Q5_K's unpacked
scales; Q6_K keeps ``q - 32`` as one int8 a weight (8.06 bits for the file's 6.56: +23% on
those tensors, read by the kernel without unpacking: 2.4x faster than unpacking bit masks).

File layouts (256 weights a super-block, 8 blocks of 32; llama.cpp's ``block_q*_K``):

* Q4_K (144 bytes): ``d``, ``dmin`` float16; 12 bytes of 6-bit scales and mins for the 8
  blocks; 128 bytes of nibbles, 32 bytes a pair of blocks (low nibbles the first, high the
  second). ``w = (d * sc) * q - dmin * mn``.
* Q5_K (176 bytes): as Q4_K, with 32 bytes ``qh`` before the nibbles: bit ``b`` of ``qh[i]`` is
  bit 4 of weight ``i`` of block ``b``.
* Q5_0 / Q5_1 (22 / 24 bytes, 32-weight blocks): ``d`` (and Q5_1's ``m``) float16, 4 bytes
  ``qh`` (bit ``j``: bit 4 of weight ``j``), 16 bytes of nibbles (weights ``j`` and ``j + 16``).
  ``w = d * (q - 16)`` / ``w = d * q + m``; kept as Q4_1-order nibbles, ``qh`` as it is, and
  ``d`` / ``m`` per block (rows of an even number of blocks: the kernel's pairs).
* Q6_K (210 bytes): 128 bytes of low nibbles (64 bytes a half super-block: low nibbles weights
  0..63, high 64..127), 64 bytes ``qh`` (2 bits a weight: bits ``2j`` of ``qh[32h + i]`` belong to
  weight ``128h + 32j + i``), 16 int8 scales (one a 16 weights), ``d`` float16.
  ``w = (d * sc) * (q - 32)``; kept as int8 ``q - 32`` in the row's order, the scales a group
  of 4 blocks at a time (their first halves, then their second halves).

:func:`split_kblocks` turns raw rows into :class:`KBlocks`; :func:`dequantize` computes each
weight with the gguf package's float32 operations in its order, so the values are bitwise the
package's (``tests/quant/test_kquant.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentlang.runtime.quant.native import KIND_Q4_K, KIND_Q5, KIND_Q5_K, KIND_Q6_K

QK_K = 256
KINDS = {"Q4_K": KIND_Q4_K, "Q5_K": KIND_Q5_K, "Q6_K": KIND_Q6_K, "Q5_0": KIND_Q5, "Q5_1": KIND_Q5}
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q5_0": 22, "Q5_1": 24}
ROW_MULTIPLE = {"Q5_0": 64, "Q5_1": 64}     # weights a row must hold in multiples (else 256)


@dataclass
class KBlocks:
    """One K-quant weight in the kernel's layout (``kquant.h``), N rows of K = 256 S weights."""

    kind: int
    qs: torch.Tensor              # uint8 [N, K/2]: low 4 bits, Q4_1's order a block;
                                  # Q6_K: int8 [N, K], q - 32 in the row's order
    d: torch.Tensor               # float16 [N, S] (Q5_0 / Q5_1: [N, K/32], a block)
    dmin: torch.Tensor | None     # float16 [N, S] (Q4_K, Q5_K); Q5_1's m [N, K/32]
    sc: torch.Tensor | None       # uint8 [N, K/32] (Q4_K, Q5_K) / int8 bits [N, K/16] (Q6_K)
    mn: torch.Tensor | None       # uint8 [N, K/32] (Q4_K, Q5_K)
    hb: torch.Tensor | None       # uint8 [N, K/128 * 16] (Q5_K) / [N, K/32 * 4] (Q5_0, Q5_1:
                                  # the file's qh)

    @property
    def in_features(self) -> int:
        return self.qs.shape[1] * (1 if self.kind == KIND_Q6_K else 2)

    def rows(self, ids) -> "KBlocks":
        pick = lambda t: None if t is None else t[ids]
        return KBlocks(self.kind, self.qs[ids], self.d[ids], pick(self.dmin), pick(self.sc),
                       pick(self.mn), pick(self.hb))

    @staticmethod
    def cat(parts: list["KBlocks"]) -> "KBlocks":
        kinds = {p.kind for p in parts}
        if len(kinds) != 1:
            raise ValueError(f"a fused linear cannot mix K-quant kinds {sorted(kinds)}")
        cat = lambda name: None if getattr(parts[0], name) is None else \
            torch.cat([getattr(p, name) for p in parts]).contiguous()
        return KBlocks(kinds.pop(), *(cat(n) for n in ("qs", "d", "dmin", "sc", "mn", "hb")))


def _f16(b: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(b).view(np.float16)[..., 0])


def _scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes ``[..., 12]`` → 6-bit scales and mins ``[..., 8]`` (blocks 0..3 in
    the low 6 bits of bytes 0..3 / 4..7; blocks 4..7 in the nibbles of bytes 8..11 with their
    top 2 bits in the top bits of bytes 0..3 / 4..7)."""
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _nibbles(q: np.ndarray) -> torch.Tensor:
    """q ``[N, nb, 32]`` (low 4 bits used) → Q4_1-order bytes ``[N, nb * 16]``."""
    lo = q & 0x0F
    packed = lo[..., :16] | (lo[..., 16:] << 4)
    return torch.from_numpy(np.ascontiguousarray(packed.reshape(q.shape[0], -1)).astype(np.uint8))


def _masks(bits: np.ndarray) -> np.ndarray:
    """bits ``[N, nb, 32]`` (0/1) → a group's two 8-byte masks over its A and B vectors
    (bit ``16 b + i`` of A: weight ``i`` of block ``b``; of B: weight ``16 + i``), ``[N, ng, 16]``."""
    n = bits.shape[0]
    g = bits.reshape(n, -1, 4, 2, 16).transpose(0, 1, 3, 2, 4)         # [N, ng, A/B, 4, 16]
    return np.packbits(g.reshape(n, -1, 2, 64), axis=-1, bitorder="little").reshape(n, -1, 16)


def split_kblocks(raw: np.ndarray, qtype: str) -> KBlocks:
    """Raw rows ``[N, S * block bytes]`` of ``qtype`` → :class:`KBlocks`."""
    n = raw.shape[0]
    b = np.ascontiguousarray(raw).reshape(n, -1, BLOCK_BYTES[qtype])
    S = b.shape[1]
    tens = lambda a: torch.from_numpy(np.ascontiguousarray(a).reshape(n, -1))
    if qtype in ("Q5_0", "Q5_1"):
        at = 2 if qtype == "Q5_0" else 4
        return KBlocks(KIND_Q5, tens(b[..., at + 4:]), _f16(b[..., 0:2]),
                       _f16(b[..., 2:4]) if qtype == "Q5_1" else None, None, None,
                       tens(b[..., at:at + 4]))
    if qtype == "Q6_K":
        ql, qh = b[..., :128], b[..., 128:192]
        lo = np.stack([ql.reshape(n, S, 2, 64) & 0x0F, ql.reshape(n, S, 2, 64) >> 4], axis=2)
        lo = lo.transpose(0, 1, 3, 2, 4).reshape(n, S, 256)             # weight 128h + 64s + i
        hi = (qh.reshape(n, S, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)) & 3
        hi = hi.reshape(n, S, 256)
        q = (lo | (hi << 4)).astype(np.int16) - 32                        # [N, S, 256]
        scales = b[..., 192:208].reshape(n, -1, 4, 2).transpose(0, 1, 3, 2)     # group: A, B
        return KBlocks(KIND_Q6_K, tens(q.astype(np.int8)), _f16(b[..., 208:210]), None,
                       tens(scales), None, None)
    sc, mn = _scale_min(b[..., 4:16])
    qs = b[..., -128:].reshape(n, S, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n, S * 8, 32)
    hb = None
    if qtype == "Q5_K":
        bits = (b[..., 16:48].reshape(n, S, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
        hb = torch.from_numpy(np.ascontiguousarray(_masks(bits.reshape(n, S * 8, 32))).reshape(n, -1))
    return KBlocks(KINDS[qtype], _nibbles(q), _f16(b[..., 0:2]), _f16(b[..., 2:4]), tens(sc),
                   tens(mn), hb)


def _unmask(masks: torch.Tensor) -> torch.Tensor:
    """:func:`_masks` back: ``[N, ng, 16]`` → bits ``[N, nb, 32]``."""
    n = masks.shape[0]
    bits = np.unpackbits(masks.numpy().reshape(n, -1, 2, 8), axis=-1, bitorder="little")
    g = bits.reshape(n, -1, 2, 4, 16).transpose(0, 1, 3, 2, 4)
    return torch.from_numpy(np.ascontiguousarray(g).reshape(n, -1, 32))


def dequantize(w: KBlocks) -> torch.Tensor:
    """The weights, float32 ``[N, K]``, computed as the gguf package computes them."""
    n, nb = w.qs.shape[0], w.in_features // 32
    if w.kind == KIND_Q6_K:
        d = w.d.float().repeat_interleave(8, dim=1)                          # [N, nb]
        sc = w.sc.view(torch.int8).view(n, -1, 2, 4).transpose(2, 3).reshape(n, nb, 2)
        step = (d[..., None] * sc.float()).repeat_interleave(16, dim=2)     # [N, nb, 32]
        return (step * w.qs.view(torch.int8).view(n, nb, 32).float()).reshape(n, -1)
    b = w.qs.view(n, nb, 16)
    q = torch.cat([b & 0x0F, b >> 4], dim=-1).to(torch.int32)              # [N, nb, 32]
    if w.kind == KIND_Q5:
        bits = np.unpackbits(w.hb.numpy().reshape(n, nb, 4), axis=-1, bitorder="little")
        q = q | (torch.from_numpy(bits).int() << 4)
        d = w.d.float()[..., None]
        if w.dmin is None:
            return (d * (q - 16).float()).reshape(n, -1)
        return (d * q.float() + w.dmin.float()[..., None]).reshape(n, -1)
    d = w.d.float().repeat_interleave(8, dim=1)                              # [N, nb]
    if w.kind == KIND_Q5_K:
        q = q | (_unmask(w.hb.view(n, -1, 16)).int() << 4)
    step = (d * w.sc.float())[..., None]
    low = (w.dmin.float().repeat_interleave(8, dim=1) * w.mn.float())[..., None]
    return (step * q.float() - low).reshape(n, -1)
