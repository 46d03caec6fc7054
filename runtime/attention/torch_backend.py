"""Paged attention in plain torch: the CPU path of the runtime and the reference for the kernels.

* Decode steps (one new token per sequence) run batched: K/V are gathered through the page
  tables into a padded tensor and attended with grouped (GQA) matmuls, no head expansion.
  When sequences share their leading pages (a common system prompt, forks, n > 1), the shared
  part is read **once** for the whole group and merged with each sequence's own suffix by
  log-sum-exp (cascade attention), so a 1k-token shared prompt is not re-read per sequence.
* Steps with longer extends loop over sequences; a sequence without cached prefix uses the
  causal SDPA kernel, one with a cached prefix an explicit mask.
All K/V reads go through ``KVPool.gather`` (which dequantizes quantized pools).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.forward_batch import ForwardBatch
from runtime.kv_pool import KVPool

MIN_SHARED_PAGES = 2     # shorter shared prefixes are not worth a separate pass


def gather_context(pool: KVPool, layer: int, which: int, pages: torch.Tensor,
                   length: int) -> torch.Tensor:
    """K (``which=0``) or V (``which=1``) of one sequence as a contiguous ``[length, H, D]``
    tensor in the compute dtype. pages: [>= ceil(length/S)] page ids."""
    S = pool.page_size
    n = (length + S - 1) // S
    return pool.gather(layer, which, pages[:n]).flatten(0, 1)[:length]


def grouped_attention(qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      valid: torch.Tensor | None, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with query rows grouped per KV head.

    qg: [B, Hkv, R, D] (R query rows per KV head); k, v: [B, L, Hkv, D];
    valid: [B, L] bool or None. Returns out [B, Hkv, R, D] and log-sum-exp [B, Hkv, R].
    """
    s = torch.matmul(qg, k.permute(0, 2, 3, 1)) * scale        # [B, Hkv, R, L]
    if valid is not None:
        s.masked_fill_(~valid[:, None, None, :], float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m)
    denom = p.sum(dim=-1, keepdim=True)
    out = torch.matmul(p, v.permute(0, 2, 1, 3)) / denom       # [B, Hkv, R, D]
    return out, (m + denom.log()).squeeze(-1)


def shared_prefix_groups(table: torch.Tensor, seq_lens: list[int], page_size: int
                         ) -> tuple[list[int], list[tuple[list[int], int]]]:
    """Groups of decode sequences whose leading pages are the same pages.

    Returns (shared pages per sequence, [(member rows, shared pages)]). A sequence's own
    newest token is never inside the shared part.
    """
    B = table.shape[0]
    shared = [0] * B
    groups: list[tuple[list[int], int]] = []
    by_first: dict[int, list[int]] = {}
    for b in range(B):
        if seq_lens[b] > page_size:
            by_first.setdefault(int(table[b, 0]), []).append(b)
    for rows in by_first.values():
        if len(rows) < 2:
            continue
        limit = min((seq_lens[b] - 1) // page_size for b in rows)
        sub = table[rows, :limit]
        same = (sub == sub[:1]).all(dim=0).int().cumprod(0)
        n = int(same.sum())
        if n >= MIN_SHARED_PAGES:
            groups.append((rows, n))
            for b in rows:
                shared[b] = n
    return shared, groups


class TorchAttentionBackend:
    name = "torch"

    def store_kv(self, pool: KVPool, layer: int, k, v, batch: ForwardBatch) -> None:
        # k, v: [T, Hkv, D]; quantized on store when the pool is
        pool.store(layer, batch.slot_mapping, k, v)

    def attend(self, q, pool: KVPool, layer: int, batch: ForwardBatch, scale: float):
        # q: [T, Hq, D] -> [T, Hq, D]
        if batch.is_decode:
            return self._decode(q, pool, layer, batch, scale)
        out = torch.empty_like(q)
        starts = batch.q_start_loc.tolist()
        for b, (seq_len, p0) in enumerate(zip(batch.seq_lens_list, batch.prefix_lens_list)):
            s, e = starts[b], starts[b + 1]
            k = gather_context(pool, layer, 0, batch.page_table[b], seq_len).to(q.dtype)
            v = gather_context(pool, layer, 1, batch.page_table[b], seq_len).to(q.dtype)
            if p0 == 0:
                mask, causal = None, True
            else:
                qpos = torch.arange(p0, seq_len).unsqueeze(1)    # [n, 1]
                mask, causal = torch.arange(seq_len).unsqueeze(0) <= qpos, False  # [n, L]
            o = F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True,
            )                                                    # [Hq, n, D]
            out[s:e] = o.transpose(0, 1)
        return out

    @staticmethod
    def _decode(q, pool: KVPool, layer: int, batch: ForwardBatch, scale: float):
        B, Hq, D = q.shape
        S = pool.page_size
        Hkv = pool.layout.num_kv_heads
        G = Hq // Hkv
        seq_lens = batch.seq_lens_list
        shared, groups = shared_prefix_groups(batch.page_table, seq_lens, S)
        # Each sequence's own part: pages [shared_b, ceil(len_b / S)).
        starts = torch.tensor(shared, dtype=torch.long)
        own_lens = [n - s * S for n, s in zip(seq_lens, shared)]
        L = max(own_lens)
        n_pages = (L + S - 1) // S
        cols = (starts[:, None] + torch.arange(n_pages)[None, :]).clamp_(
            max=batch.page_table.shape[1] - 1)                       # [B, n_pages]
        table = batch.page_table.long().gather(1, cols)
        k = pool.gather(layer, 0, table).flatten(1, 2)[:, :L].to(q.dtype)  # [B, L, Hkv, D]
        v = pool.gather(layer, 1, table).flatten(1, 2)[:, :L].to(q.dtype)
        valid = torch.arange(L)[None, :] < torch.tensor(own_lens)[:, None]  # [B, L]
        qg = q.view(B, Hkv, G, D)
        out, lse = grouped_attention(qg, k, v, valid, scale)          # [B, Hkv, G, D], [B, Hkv, G]
        for rows, n in groups:
            pages = batch.page_table[rows[0], :n].long()
            kp = pool.gather(layer, 0, pages).flatten(0, 1).to(q.dtype)[None]   # [1, n*S, Hkv, D]
            vp = pool.gather(layer, 1, pages).flatten(0, 1).to(q.dtype)[None]
            M = len(rows)
            qp = qg[rows].permute(1, 0, 2, 3).reshape(1, Hkv, M * G, D)
            op, lp = grouped_attention(qp, kp, vp, None, scale)       # [1, Hkv, M*G, D]
            op = op.view(Hkv, M, G, D).permute(1, 0, 2, 3)            # [M, Hkv, G, D]
            lp = lp.view(Hkv, M, G).permute(1, 0, 2)                  # [M, Hkv, G]
            ls = lse[rows]
            mx = torch.maximum(lp, ls)
            wp, ws = torch.exp(lp - mx), torch.exp(ls - mx)
            out[rows] = (op * wp[..., None] + out[rows] * ws[..., None]) / (wp + ws)[..., None]
        return out.reshape(B, Hq, D)

    def copy_pages(self, pool: KVPool, src: list[int], dst: list[int]) -> None:
        pool.copy_pages(src, dst)
