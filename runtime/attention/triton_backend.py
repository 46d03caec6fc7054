"""Paged attention with the Triton kernels of :mod:`kernels` (the GPU path).

Takes the same :class:`~agentlang.runtime.attention.forward_batch.ForwardBatch` as the torch backend. Decode steps
(one new token per sequence) use the split-KV decode kernel; every other step, mixed ones
included, uses the extend kernel, which reads the new tokens' K/V from the layer's contiguous
tensors (a float pool holds exactly those values) and only the cached prefixes through the page
tables. The index ranges of a batch's metadata (page table, sequence lengths, slots) are checked
once per batch and pool, with one device sync, not once per layer; so are the host-side maxima
every launch takes.
Runs on CPU only under the Triton interpreter (``TRITON_INTERPRET=1`` before import).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from agentlang.kernels import (check_ranges, copy_pages, decode_attention, extend_attention,
                               page_table_checks, store_kv)
from agentlang.runtime.attention.forward_batch import ForwardBatch
from agentlang.runtime.attention.window import windowed_attend
from agentlang.runtime.cache.kv_pool import KVPool


class BatchMaxima(NamedTuple):
    """A batch's longest sequence, extend and cached prefix (host ints)."""

    seq: int
    extend: int
    prefix: int


class TritonAttentionBackend:
    name = "triton"
    graph_safe = True   # decode launches read device metadata + the batch maxima (upper bounds)

    def __init__(self) -> None:
        # The (batch, pool) whose metadata ranges were checked last, with the batch's host-side
        # maxima; held by reference, so the identity test cannot match a different, newer object.
        self._checked: tuple[ForwardBatch, KVPool, BatchMaxima] | None = None

    def _check_batch(self, pool: KVPool, batch: ForwardBatch) -> BatchMaxima:
        """Check the batch's metadata against the pool once per (batch, pool); returns the
        longest sequence, extend and prefix of the batch (host ints every layer's launch needs)."""
        if self._checked is not None and self._checked[0] is batch and self._checked[1] is pool:
            return self._checked[2]
        S, P = batch.page_size, pool.num_pages
        if S != pool.page_size:
            raise ValueError(f"batch.page_size {S} differs from the pool's page_size {pool.page_size}")
        ext = batch.q_start_loc[1:] - batch.q_start_loc[:-1]
        check_ranges(
            [
                ("batch.slot_mapping", batch.slot_mapping, 0, P * S - 1),
                ("batch.q_start_loc[0]", batch.q_start_loc[:1], 0, 0),
                ("batch.q_start_loc[B]", batch.q_start_loc[-1:], batch.num_tokens, batch.num_tokens),
                ("batch.seq_lens - batch.prefix_lens - extend lengths",
                 batch.seq_lens - batch.prefix_lens - ext, 0, 0),
                ("batch.prefix_lens", batch.prefix_lens, 0, batch.page_table.shape[1] * S),
            ]
            + page_table_checks(batch.page_table, batch.seq_lens, P, S)
        )
        maxima = BatchMaxima(max(batch.seq_lens_list), max(batch.extend_lens_list),
                             max(batch.prefix_lens_list))
        self._checked = (batch, pool, maxima)
        return maxima

    def store_kv(
        self, pool: KVPool, layer: int, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> None:
        # k, v: [T, Hkv, D]
        self._check_batch(pool, batch)
        slots = pool.window_slots(batch.slot_mapping) if pool.windowed(layer) else batch.slot_mapping
        store_kv(k, v, pool.k_cache(layer), pool.v_cache(layer), slots,
                 k_scale=pool.k_scale(layer), v_scale=pool.v_scale(layer), check_indices=False)

    def attend(
        self, q: torch.Tensor, pool: KVPool, layer: int, batch: ForwardBatch, scale: float,
        k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
        window: int = 0, softcap: float = 0.0,
    ) -> torch.Tensor:
        # q: [T, Hq, D] -> [T, Hq, D]; k_new, v_new: [T, Hkv, D] or None
        longest = self._check_batch(pool, batch)
        if window or softcap:      # the kernels have neither: the torch path, on this device
            return windowed_attend(q, pool, layer, batch, scale, window, softcap)
        kc, vc = pool.k_cache(layer), pool.v_cache(layer)
        ks, vs = pool.k_scale(layer), pool.v_scale(layer)   # None unless the pool is 8-bit
        if ks is not None or k_new is None or k_new.dtype != kc.dtype or v_new.dtype != vc.dtype:
            # the extend kernel reads them only when they are bitwise what the pool holds
            k_new = v_new = None
        if batch.is_decode:
            return decode_attention(
                q, kc, vc, batch.page_table, batch.seq_lens, scale,
                max_seq_len=longest.seq, check_indices=False,
                k_scale=ks, v_scale=vs,
            )
        return extend_attention(
            q, kc, vc, batch.page_table, batch.q_start_loc, batch.prefix_lens, batch.seq_lens,
            scale, max_extend_len=longest.extend, check_indices=False,
            k_scale=ks, v_scale=vs, k_new=k_new, v_new=v_new, max_prefix_len=longest.prefix,
        )

    def copy_pages(self, pool: KVPool, src: list[int], dst: list[int]) -> None:
        if len(src) != len(dst):
            raise ValueError("copy_pages: src and dst differ in length")
        if not src:
            return
        if pool.windows is not None:    # two page groups: the pool's own copy
            pool.copy_pages(src, dst)
            return
        s = torch.tensor(src, dtype=torch.int64, device=pool.device)
        d = torch.tensor(dst, dtype=torch.int64, device=pool.device)
        copy_pages(pool.buffer, s, d, scales=pool.scales)
