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


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      valid: torch.Tensor | None, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of R query rows per KV head over one K/V sequence per batch entry.

    q: [B, Hkv, R, D]; k, v: [B, L, Hkv, D] as gathered from the pool (no re-layout copy);
    valid: [B, L] bool or None. Returns out [B, Hkv, R, D] and log-sum-exp [B, Hkv, R].
    Each batch entry is one matmul against all heads at once (Hkv× the few FLOPs of a decode,
    none of the copies a per-head layout would need); the head diagonal is kept.
    """
    B, H, R, D = q.shape
    L = k.shape[1]
    s = torch.bmm(q.reshape(B, H * R, D), k.reshape(B, L * H, D).transpose(1, 2))
    s = s.view(B, H, R, L, H).diagonal(dim1=1, dim2=4)          # [B, R, L, H]
    s = s * scale
    if valid is not None:
        s.masked_fill_(~valid[:, None, :, None], float("-inf"))
    m = s.amax(dim=2, keepdim=True)                              # [B, R, 1, H]
    p = torch.exp(s - m)
    denom = p.sum(dim=2, keepdim=True)
    pv = torch.bmm(p.permute(0, 3, 1, 2).reshape(B, H * R, L), v.reshape(B, L, H * D))
    out = pv.view(B, H, R, H, D).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # [B, H, R, D]
    denom = denom.squeeze(2).permute(0, 2, 1)                    # [B, H, R]
    lse = m.squeeze(2).permute(0, 2, 1) + denom.log()
    return out / denom[..., None], lse


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


def length_buckets(lengths: list[int], max_waste: float = 0.25) -> list[list[int]]:
    """Indices grouped by similar length (sorted), closing a bucket when padding the next
    sequence to the bucket's longest would waste more than ``max_waste`` of the bucket."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    buckets: list[list[int]] = []
    for i in order:
        if buckets:
            b = buckets[-1]
            longest = lengths[b[0]]
            used = sum(lengths[j] for j in b) + lengths[i]
            if used >= (1 - max_waste) * longest * (len(b) + 1):
                b.append(i)
                continue
        buckets.append([i])
    return buckets


class TorchAttentionBackend:
    name = "torch"
    graph_safe = False  # sizes its gathers and groups from the batch's host lists

    def store_kv(self, pool: KVPool, layer: int, k, v, batch: ForwardBatch) -> None:
        # k, v: [T, Hkv, D]; quantized on store when the pool is
        pool.store(layer, batch.slot_mapping, k, v)

    def attend(self, q, pool: KVPool, layer: int, batch: ForwardBatch, scale: float,
               k_new=None, v_new=None):
        # q: [T, Hq, D] -> [T, Hq, D]; every K/V read goes through the pool (k_new, v_new unused)
        seq_lens = batch.seq_lens_list
        if batch.is_decode:
            return self._decode(q, pool, layer, batch.page_table, seq_lens, scale)
        out = torch.empty_like(q)
        starts = batch.q_start_loc.tolist()
        ext = batch.extend_lens_list
        singles = [b for b in range(batch.batch_size) if ext[b] == 1]
        if len(singles) > 1:   # the decodes of a mixed step still run as one batch
            rows = [starts[b] for b in singles]
            out[rows] = self._decode(q[rows], pool, layer, batch.page_table[singles],
                                     [seq_lens[b] for b in singles], scale)
        else:
            singles = []
        for b in sorted(set(range(batch.batch_size)) - set(singles)):
            seq_len, p0 = seq_lens[b], batch.prefix_lens_list[b]
            s, e = starts[b], starts[b + 1]
            k = gather_context(pool, layer, 0, batch.page_table[b], seq_len).to(q.dtype)
            v = gather_context(pool, layer, 1, batch.page_table[b], seq_len).to(q.dtype)
            if p0 == 0:
                mask, causal = None, True
            else:
                qpos = torch.arange(p0, seq_len, device=q.device).unsqueeze(1)  # [n, 1]
                mask, causal = torch.arange(seq_len, device=q.device)[None, :] <= qpos, False  # [n, L]
            o = F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True,
            )                                                    # [Hq, n, D]
            out[s:e] = o.transpose(0, 1)
        return out

    @staticmethod
    def _decode(q, pool: KVPool, layer: int, page_table: torch.Tensor, seq_lens: list[int],
                scale: float):
        """One new token per sequence. q: [B, Hq, D]; page_table: [B, max_pages].

        Sequences are processed in buckets of similar length (padding stays small); each
        sequence attends to its own pages, and a group sharing leading pages attends to the
        shared part once, merged by log-sum-exp."""
        B, Hq, D = q.shape
        S = pool.page_size
        Hkv = pool.layout.num_kv_heads
        G = Hq // Hkv
        qg = q.view(B, Hkv, G, D)
        shared, groups = shared_prefix_groups(page_table, seq_lens, S)
        own_lens = [n - s * S for n, s in zip(seq_lens, shared)]
        out = torch.empty(B, Hkv, G, D, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, Hkv, G, dtype=q.dtype, device=q.device)
        table = page_table.long()
        dev = q.device
        for rows in length_buckets(own_lens):
            L = max(own_lens[b] for b in rows)
            n = (L + S - 1) // S
            cols = (torch.tensor([shared[b] for b in rows], device=dev)[:, None]
                    + torch.arange(n, device=dev)[None, :])
            t = table[rows].gather(1, cols.clamp_(max=table.shape[1] - 1))      # [b, n]
            k = pool.gather(layer, 0, t).flatten(1, 2)[:, :L].to(q.dtype)        # [b, L, Hkv, D]
            v = pool.gather(layer, 1, t).flatten(1, 2)[:, :L].to(q.dtype)
            valid = (torch.arange(L, device=dev)[None, :]
                     < torch.tensor([own_lens[b] for b in rows], device=dev)[:, None])
            out[rows], lse[rows] = grouped_attention(qg[rows], k, v, valid, scale)
        for rows, n in groups:
            pages = table[rows[0], :n]
            kp = pool.gather(layer, 0, pages).flatten(0, 1).to(q.dtype)[None]  # [1, n*S, Hkv, D]
            vp = pool.gather(layer, 1, pages).flatten(0, 1).to(q.dtype)[None]
            M = len(rows)
            qp = qg[rows].transpose(0, 1).reshape(1, Hkv, M * G, D)
            op, lp = grouped_attention(qp, kp, vp, None, scale)       # [1, Hkv, M*G, D]
            op = op.view(Hkv, M, G, D).transpose(0, 1)                 # [M, Hkv, G, D]
            lp = lp.view(Hkv, M, G).transpose(0, 1)                    # [M, Hkv, G]
            ls = lse[rows]
            mx = torch.maximum(lp, ls)
            wp, ws = torch.exp(lp - mx), torch.exp(ls - mx)
            out[rows] = (op * wp[..., None] + out[rows] * ws[..., None]) / (wp + ws)[..., None]
        return out.reshape(B, Hq, D)

    def copy_pages(self, pool: KVPool, src: list[int], dst: list[int]) -> None:
        pool.copy_pages(src, dst)
