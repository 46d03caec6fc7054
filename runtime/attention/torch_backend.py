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


def gather_context(pool: KVPool, layer: int, which: int, pages: torch.Tensor,
                   length: int) -> torch.Tensor:
    """K (``which=0``) or V (``which=1``) of one sequence as a contiguous ``[length, H, D]``
    tensor in the compute dtype (dequantized by the pool when it is quantized).

    pages: [>= ceil(length/S)] page ids.
    """
    S = pool.page_size
    n = (length + S - 1) // S
    return pool.gather(layer, which, pages[:n]).flatten(0, 1)[:length]


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
            qpos = torch.arange(p0, seq_len).unsqueeze(1)        # [n, 1]
            mask = torch.arange(seq_len).unsqueeze(0) <= qpos    # [n, L]
            o = F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                attn_mask=mask, scale=scale, enable_gqa=True,
            )                                                    # [Hq, n, D]
            out[s:e] = o.transpose(0, 1)
        return out

    @staticmethod
    def _decode(q, pool: KVPool, layer: int, batch: ForwardBatch, scale: float):
        B, Hq, D = q.shape
        S = pool.page_size
        max_len = max(batch.seq_lens_list)
        n = (max_len + S - 1) // S
        table = batch.page_table[:, :n].long()                    # [B, n]
        k = pool.gather(layer, 0, table).flatten(1, 2)[:, :max_len].to(q.dtype)  # [B, L, Hkv, D]
        v = pool.gather(layer, 1, table).flatten(1, 2)[:, :max_len].to(q.dtype)
        valid = torch.arange(max_len).unsqueeze(0) < batch.seq_lens.long().unsqueeze(1).cpu()
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=valid.to(q.device)[:, None, None, :], scale=scale, enable_gqa=True,
        )                                                          # [B, Hq, 1, D]
        return o.squeeze(2)

    def copy_pages(self, pool: KVPool, src: list[int], dst: list[int]) -> None:
        pool.copy_pages(src, dst)
