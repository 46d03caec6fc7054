"""Attention with a sliding window and/or soft-capped scores (Gemma 2 / Gemma 3 layers).

A query at position ``p`` of a sliding layer with window ``W`` sees the keys at positions
``p - W + 1 .. p`` (HF's ``kv_idx > q_idx - sliding_window``; llama.cpp's standard SWA: the
same keys). Soft-capping (Gemma 2) replaces each scaled score ``s`` by ``cap * tanh(s / cap)``
before the mask and the softmax, as HF's eager attention does.

Each sequence attends alone, in blocks of :data:`BLOCK` queries; a block reads only the pages
that hold keys some query of it can see (``window`` back from its first query), so a sliding
layer's cost is bounded by the window whatever the context, and pages before it are never
read. Scores, the cap, the mask and the softmax are float32; the matmuls run in q's dtype
(float32 in the fidelity tests). Works on any device (plain torch); the paged fast paths of
the backends (cascade, native decode, Triton kernels) serve the layers without either.
"""

from __future__ import annotations

import torch

from agentlang.runtime.attention.forward_batch import ForwardBatch
from agentlang.runtime.cache.window_pages import first_visible

BLOCK = 128   # query tokens a block (bounds the score matrix at BLOCK x (window + BLOCK))


def windowed_attend(q: torch.Tensor, pool, layer: int, batch: ForwardBatch, scale: float,
                    window: int, softcap: float) -> torch.Tensor:
    """Causal attention of ``q [T, Hq, D]`` over each sequence's context in the pool, each
    query limited to its last ``window`` keys (0: all) and its scores capped at ``softcap``
    (0: uncapped). Returns ``[T, Hq, D]`` in q's dtype."""
    T, Hq, D = q.shape
    Hkv = pool.layout.num_kv_heads
    G, S = Hq // Hkv, pool.page_size
    out = torch.empty_like(q)
    starts = batch.q_start_loc.tolist()
    for b, (seq_len, prefix) in enumerate(zip(batch.seq_lens_list, batch.prefix_lens_list)):
        for s in range(prefix, seq_len, BLOCK):                  # positions s..e-1
            e = min(seq_len, s + BLOCK)
            lo = first_visible(s, window) // S * S               # first key read (page-aligned)
            pages = batch.page_table[b, lo // S:(e + S - 1) // S].long()
            k, v = pool.gather_kv(layer, pages)                  # [p, S, Hkv, D]
            k = k.flatten(0, 1)[:e - lo].to(q.dtype)             # [L, Hkv, D], positions lo..e-1
            v = v.flatten(0, 1)[:e - lo].to(q.dtype)
            rows = slice(starts[b] + s - prefix, starts[b] + e - prefix)
            qb = q[rows].view(e - s, Hkv, G, D).permute(1, 2, 0, 3)          # [Hkv, G, n, D]
            scores = torch.matmul(qb, k.permute(1, 2, 0)[:, None]).float() * scale  # [Hkv, G, n, L]
            if softcap:
                scores = torch.tanh(scores / softcap) * softcap
            qpos = torch.arange(s, e, device=q.device)[:, None]
            kpos = torch.arange(lo, e, device=q.device)[None, :]
            hidden = kpos > qpos                                               # [n, L]
            if window:
                hidden |= kpos <= qpos - window
            p = scores.masked_fill_(hidden, float("-inf")).softmax(-1)
            o = torch.matmul(p.to(v.dtype), v.permute(1, 0, 2)[:, None])       # [Hkv, G, n, D]
            out[rows] = o.permute(2, 0, 1, 3).reshape(e - s, Hq, D).to(q.dtype)
    return out
