"""Float32 attention on CPU through oneDNN, one (batch element, KV head) at a time.

Why: torch's float32 ``matmul`` on CPU is MKL's, and on AMD processors MKL runs its AVX2 code
(measured on a 2-core Zen 5 EPYC: 204 GFLOP/s for a 1024³ sgemm, against 454 through oneDNN,
the library torch already uses for bf16). The scores' matmul is worse still: its keys, as the
pool stores them (``[L, Hkv, D]``), are a strided operand, and MKL reached 43 GFLOP/s on a
prefill block's shape (3 KV heads × 384 rows × 2016 keys × 64) where oneDNN reaches ~300 with
the keys copied into ``[Hkv, L, D]`` first. Extend attention over a long cached context is
mostly these two matmuls (73 % of a float32 extend step over 1900 cached tokens), so this is
what makes a resumed agent turn cheap in float32.

oneDNN is reached through torch's ``torch.ops.mkldnn._linear_pointwise`` (``x @ W^T`` for a
2-D ``W``; torch has no public float32 entry to oneDNN's matmul, so that one call lives in
:func:`linear` alone — with :func:`pack_weight`, the reorder that
``runtime/models/packed_linear.py`` uses — and :data:`ONEDNN` / :data:`PACKING` check they
exist in the build): per (batch element, KV head) the scores ``q k^T`` (keys copied into ``[L, D]``), the
mask and the softmax in place, then ``p v`` (values copied into ``[D, L]``) — each score
matrix is made once, contiguous, and never copied (assembling all heads' scores into one
tensor cost as much as the matmul). It is used for float32 on CPU from
:data:`MIN_ROWS` query rows on (a decode step's few rows stay with torch: a call's fixed cost
would dominate); other dtypes (bf16 already runs on oneDNN) and devices keep ``torch.matmul``.
The arithmetic is float32 throughout, like MKL's: outputs agree to float32 rounding, and
neither library promises a row the same bits in calls of different sizes (what keeps greedy
outputs invariant to chunking and cache state here is what kept them with MKL; the invariance
tests cover both).
"""

from __future__ import annotations

from typing import Callable

import torch

MIN_ROWS = 16   # query rows a KV head from which float32 attention goes through oneDNN


def _onednn() -> bool:
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


ONEDNN = _onednn()   # torch built with oneDNN's linear (read once: a property of the build)
PACKING = ONEDNN and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")   # and its reorder


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w^T (+ bias)`` by oneDNN. x: [R, K] contiguous; w: [N, K] contiguous or as
    :func:`pack_weight` returns it -> [R, N] contiguous."""
    return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


def pack_weight(w: torch.Tensor, rows_hint: int) -> torch.Tensor:
    """w [N, K] (CPU, float32 or bfloat16) reordered once into the blocked layout oneDNN's GEMM
    reads, chosen for calls of ``rows_hint`` rows (any row count runs): an opaque oneDNN tensor
    (no storage) for :func:`linear` only."""
    return torch.ops.mkldnn._reorder_linear_weight(w, rows_hint)


def applies(q: torch.Tensor) -> bool:
    """Whether :func:`attend` runs for queries ``q [..., H, R, D]``."""
    return (ONEDNN and q.dtype == torch.float32 and q.device.type == "cpu"
            and q.shape[-2] >= MIN_ROWS)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: torch.Tensor | None,
           normalize: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention per (leading index, KV head), float32.

    q: [..., H, R, D]; k, v: [..., L, H, D] (the same leading dims); masked: bool over the last
    ``t`` keys, broadcastable to [..., H, R, t], or None (as ``cascade.attend_lse``); normalize:
    ``cascade.attend_lse``'s — masks a contiguous score matrix [R, L] with its slice of
    ``masked`` [R, t], turns it into probabilities in place and returns the log-sum-exp [R]. Returns out [..., H, R, D] and lse [..., H, R] float32."""
    *lead, H, R, D = q.shape
    if tuple(k.shape[:-3]) != tuple(lead):
        raise ValueError(f"leading dims differ: {tuple(lead)} vs {tuple(k.shape[:-3])}")
    L = k.shape[-3]
    qs = q.reshape(-1, R, D)                                              # [n, R, D]
    ks = k.movedim(-3, -2).contiguous().view(-1, L, D)                    # [n, L, D]
    vs = v.movedim(-3, -1).contiguous().view(-1, D, L)                    # [n, D, L]
    ms = None
    if masked is not None:
        t = masked.shape[-1]
        ms = torch.broadcast_to(masked, (*lead, H, R, t)).reshape(-1, R, t)
    out = torch.empty(qs.shape[0], R, D)
    lse = torch.empty(qs.shape[0], R)
    for i in range(qs.shape[0]):
        s = linear(qs[i].contiguous(), ks[i])                         # [R, L]
        lse[i] = normalize(s, None if ms is None else ms[i])
        out[i] = linear(s, vs[i])                                     # [R, D]
    return out.view(*lead, H, R, D), lse.view(*lead, H, R)
