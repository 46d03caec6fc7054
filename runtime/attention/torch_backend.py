"""Paged attention in plain torch: the CPU path of the runtime and the reference for the kernels.

Decode steps (one new token per sequence) run as one padded, masked SDPA over K/V gathered
through the page table; steps with longer extends loop over sequences (prefill is rare and
dominated by its matmuls).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.forward_batch import ForwardBatch
from runtime.kv_pool import KVPool


def gather_context(cache: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """K or V of one sequence as a contiguous ``[length, H, D]`` tensor.

    cache: [P, S, H, D]; pages: [>= ceil(length/S)] page ids.
    """
    S = cache.shape[1]
    n = (length + S - 1) // S
    return cache[pages[:n].long()].flatten(0, 1)[:length]


class TorchAttentionBackend:
    name = "torch"

    def store_kv(self, pool: KVPool, layer: int, k, v, batch: ForwardBatch) -> None:
        # k, v: [T, Hkv, D]
        H, D = k.shape[1], k.shape[2]
        slots = batch.slot_mapping
        pool.k_cache(layer).view(-1, H, D).index_copy_(0, slots, k.to(pool.layout.dtype))
        pool.v_cache(layer).view(-1, H, D).index_copy_(0, slots, v.to(pool.layout.dtype))

    def attend(self, q, pool: KVPool, layer: int, batch: ForwardBatch, scale: float):
        # q: [T, Hq, D] -> [T, Hq, D]
        kc, vc = pool.k_cache(layer), pool.v_cache(layer)
        if batch.is_decode:
            return self._decode(q, kc, vc, batch, scale)
        out = torch.empty_like(q)
        starts = batch.q_start_loc.tolist()
        for b, (seq_len, p0) in enumerate(zip(batch.seq_lens_list, batch.prefix_lens_list)):
            s, e = starts[b], starts[b + 1]
            k = gather_context(kc, batch.page_table[b], seq_len).to(q.dtype)
            v = gather_context(vc, batch.page_table[b], seq_len).to(q.dtype)
            qpos = torch.arange(p0, seq_len).unsqueeze(1)        # [n, 1]
            mask = torch.arange(seq_len).unsqueeze(0) <= qpos    # [n, L]
            o = F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                attn_mask=mask, scale=scale, enable_gqa=True,
            )                                                    # [Hq, n, D]
            out[s:e] = o.transpose(0, 1)
        return out

    @staticmethod
    def _decode(q, kc, vc, batch: ForwardBatch, scale: float):
        B, Hq, D = q.shape
        S = kc.shape[1]
        max_len = max(batch.seq_lens_list)
        n = (max_len + S - 1) // S
        table = batch.page_table[:, :n].long()                    # [B, n]
        k = kc[table].flatten(1, 2)[:, :max_len].to(q.dtype)      # [B, L, Hkv, D]
        v = vc[table].flatten(1, 2)[:, :max_len].to(q.dtype)
        valid = torch.arange(max_len).unsqueeze(0) < batch.seq_lens.long().unsqueeze(1).cpu()
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=valid.to(q.device)[:, None, None, :], scale=scale, enable_gqa=True,
        )                                                          # [B, Hq, 1, D]
        return o.squeeze(2)

    def copy_pages(self, pool: KVPool, src: list[int], dst: list[int]) -> None:
        pool.copy_pages(src, dst)
