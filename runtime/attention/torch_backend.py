"""Paged attention in plain torch: the CPU path of the runtime and the reference for the kernels.

* Decode steps (one new token per sequence) run batched: K/V are gathered through the page
  tables into a padded tensor and attended per KV head (its G query heads as G rows of one
  matmul: GQA without head expansion). Which pages each sequence reads, the padding and the
  groups below are planned once per step (:mod:`agentlang.runtime.attention.decode_plan`), not per layer.
  When sequences share their leading pages (a common system prompt, forks, n > 1), the shared
  part is read **once** for the whole group and merged with each sequence's own suffix by
  log-sum-exp (cascade attention), so a 1k-token shared prompt is not re-read per sequence.
  Where the native library runs (CPU, float32 / bf16, unquantized pool), each sequence's own
  part is attended by ``runtime/quant/native/paged_attention.c`` reading the pages in place
  (no gathered copy; 2.3x faster decode attention on the independent workload, issue 29);
  the buckets below are the fallback.
* Steps with longer extends: sequences whose cached prefixes begin with the same pages (n
  requests with one system prompt) attend to those pages once for the whole group, merged
  with each one's own part (:mod:`agentlang.runtime.attention.cascade`). Any other sequence
  appending few tokens to a short enough context (:func:`worth_rows`: a jump-forward or
  speculative verify, a short prompt) runs where the native library does as one decode row per
  token (:class:`ShortExtends`), the arithmetic of a one-token decode at each position and
  ~150 µs a layer less than torch's ops; the rest run alone, in causal blocks of queries
  (``causal_attend``). A float32 model that runs its large calls as bf16 GEMMs (the engine's
  ``bf16_gemm_rows``: ``bf16_rows`` here) attends those alone in bfloat16 too, in steps of that
  many tokens or more (its queries and keys rounded to bf16: the AMX tiles where they run).
All K/V reads go through ``KVPool.gather`` (which dequantizes quantized pools).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentlang.runtime.attention.cascade import (attend_lse, attend_shared, causal_attend,
                                                 extend_group, extend_plan, kv_of,
                                                 merge_lse, merged)
from agentlang.runtime.attention.decode_plan import DecodePlan, cascade_min_keys, decode_plan
from agentlang.runtime.attention.forward_batch import ForwardBatch
from agentlang.runtime.attention.window import windowed_attend
from agentlang.runtime.cache.kv_pool import KVPool
from agentlang.runtime.quant.native import QMatmulLibrary, qmatmul_library


def native_decode(q: torch.Tensor, pool: KVPool) -> QMatmulLibrary | None:
    """The native library where a decode step's attention runs in it
    (``runtime/quant/native/paged_attention.c``: each row's pages read in place, no gathered
    copy): CPU, float32 or bfloat16 queries and an unquantized pool; else None."""
    if (q.device.type != "cpu" or pool.layout.quantized
            or q.dtype not in (torch.float32, torch.bfloat16)):
        return None
    return qmatmul_library()


def merge_shared(qg, out, lse, pool: KVPool, layer: int, plan: DecodePlan, scale: float,
                 native: QMatmulLibrary | None = None):
    """A decode step's ``out`` [B, Hkv, G, D] (each row's own part, lse [B, Hkv, G]; queries
    qg [B, Hkv, G, D]) merged with each shared group's part, attended once for the group
    (cascade attention); returns ``out``. With ``native`` (the pool unquantized in q's dtype,
    ``out`` and ``lse`` contiguous) a run of consecutive shared pages is read as a view of the
    pool and the merge runs in place in one native call (``merge_lse_``; the torch ops and
    the row gathers cost ~8 ms of a 64-row step sharing a 1k-token prefix)."""
    kc, vc = pool.k_cache(layer), pool.v_cache(layer)
    views = native is not None and kc.dtype == qg.dtype    # a narrower pool: gathered, widened
    for g in plan.groups:
        length = g.pages.numel() * pool.page_size
        if views and g.first_page is not None:
            run = slice(g.first_page, g.first_page + g.pages.numel())
            kp = kc[run].flatten(0, 1)                                   # [n*S, Hkv, D]
            vp = vc[run].flatten(0, 1)
        else:
            kp, vp = kv_of(pool, layer, g.pages, length, qg.dtype)       # [n*S, Hkv, D]
        o2, l2 = attend_shared(qg if g.everyone else qg[g.rows], kp, vp, scale)
        if native is not None and g.everyone:
            out = merged(out, lse, o2, l2)                  # in place where it can
        else:
            out[g.rows] = (merge_lse if native is None else merged)(out[g.rows], lse[g.rows],
                                                                    o2, l2)
    return out


def worth_rows(new: int, seq_len: int) -> bool:
    """Whether ``new`` tokens ending a ``seq_len``-token context cost less as ``new`` decode
    rows of the native kernel (each reads its keys: ~28 ns a key and KV head group on 2 AVX-512
    cores) than as one sequence of :func:`causal_attend` (~150 µs of torch ops a layer plus
    ~0.3 µs a key for the gather). Measured with bf16 K/V at hd 64, G 3 (issue 29): 16 tokens
    over 80 keys 56 vs 180 µs, 2 over 1k keys 93 vs 508 µs; 33 over 1k keys 2.3 vs 0.8 ms."""
    return new * seq_len * 28 <= 150_000 + 300 * seq_len


MAX_STORE_RUNS = 16   # more runs of slots than this (a decode step's): one indexed copy


def slot_runs(slots: list[int]) -> list[tuple[int, int, int]] | None:
    """(first token, first slot, length) of each run of consecutive ``slots``, or None when
    there are more than :data:`MAX_STORE_RUNS` of them."""
    runs: list[list[int]] = []
    for t, slot in enumerate(slots):
        if runs and slot == runs[-1][1] + runs[-1][2]:
            runs[-1][2] += 1
        elif len(runs) == MAX_STORE_RUNS:
            return None
        else:
            runs.append([t, slot, 1])
    return [(t, slot, n) for t, slot, n in runs]


@dataclass(frozen=True)
class ShortExtends:
    """Sequences of an extend step attended as one decode row per new token (the native
    kernel, pages read in place): token ``j`` of a sequence with ``prefix`` cached tokens is a
    row of ``prefix + j + 1`` keys, the arithmetic of a one-token decode at that position."""
    members: frozenset[int]      # batch rows served this way
    tokens: torch.Tensor         # [R] int64 query-token rows, member by member
    pages: torch.Tensor          # [R, n] int64 each row's page-table row
    lens: torch.Tensor           # [R] int64 keys of each row


def short_extends(page_table: torch.Tensor, starts: list[int], seq_lens: list[int],
                  prefix_lens: list[int], rows: list[int]) -> ShortExtends | None:
    """The :class:`ShortExtends` of ``rows`` (batch rows) where :func:`worth_rows` holds, or
    None when none does. page_table: [B, max_pages]; starts: [B + 1] query-token offsets."""
    chosen = [b for b in rows if worth_rows(seq_lens[b] - prefix_lens[b], seq_lens[b])]
    if not chosen:
        return None
    counts = [seq_lens[b] - prefix_lens[b] for b in chosen]
    tokens = torch.cat([torch.arange(starts[b], starts[b + 1]) for b in chosen])
    lens = torch.cat([torch.arange(prefix_lens[b] + 1, seq_lens[b] + 1) for b in chosen])
    pages = page_table[chosen].long().repeat_interleave(torch.tensor(counts), dim=0)
    return ShortExtends(frozenset(chosen), tokens, pages.contiguous(), lens)


class TorchAttentionBackend:
    name = "torch"
    graph_safe = False  # sizes its gathers and groups from the batch's host lists

    def __init__(self, bf16_rows: int | None = None):
        # float32 steps of this many tokens or more attend their causal blocks in bf16 (None:
        # never; module doc)
        self.bf16_rows = bf16_rows

    def store_kv(self, pool: KVPool, layer: int, k, v, batch: ForwardBatch) -> None:
        # k, v: [T, Hkv, D]; quantized on store when the pool is. A prefill's slots are a few
        # runs of consecutive ones: a slice copy each, not one indexed copy of a stacked K/V
        # (2048 tokens: ~0.3 ms a layer -> ~0.1)
        runs = None
        if (pool.scales is None and k.dtype == v.dtype       # copy_ rounds to a narrower pool
                and layer not in pool.layout.window_layers):
            runs = batch.cached("torch.slot_runs", lambda: slot_runs(batch.slot_mapping.tolist()))
        if runs is None:
            pool.store(layer, batch.slot_mapping, k, v)
            return
        kc, vc = pool.k_cache(layer).flatten(0, 1), pool.v_cache(layer).flatten(0, 1)  # [P*S,..]
        for t, slot, n in runs:
            kc[slot:slot + n].copy_(k[t:t + n])
            vc[slot:slot + n].copy_(v[t:t + n])

    def attend(self, q, pool: KVPool, layer: int, batch: ForwardBatch, scale: float,
               k_new=None, v_new=None, window: int = 0, softcap: float = 0.0):
        # q: [T, Hq, D] -> [T, Hq, D]; every K/V read goes through the pool (k_new, v_new unused)
        if window or softcap:
            return windowed_attend(q, pool, layer, batch, scale, window, softcap)
        seq_lens = batch.seq_lens_list
        native = native_decode(q, pool)
        min_keys = cascade_min_keys(q.dtype, native is not None)
        if batch.is_decode:
            plan = batch.cached("torch.decode", lambda: decode_plan(batch.page_table, seq_lens,
                                                                    pool.page_size, min_keys))
            return self._decode(q, pool, layer, plan, scale)
        out = torch.empty_like(q)
        starts = batch.q_start_loc.tolist()
        ext = batch.extend_lens_list
        singles = [b for b in range(batch.batch_size) if ext[b] == 1]
        if len(singles) > 1:   # the decodes of a mixed step still run as one batch
            rows = [starts[b] for b in singles]
            plan = batch.cached("torch.decode_singles", lambda: decode_plan(
                batch.page_table[singles], [seq_lens[b] for b in singles], pool.page_size,
                min_keys))
            out[rows] = self._decode(q[rows], pool, layer, plan, scale)
        else:
            singles = []
        rest = sorted(set(range(batch.batch_size)) - set(singles))
        groups = batch.cached("torch.extend_groups", lambda: extend_plan(
            batch.page_table, starts, seq_lens, batch.prefix_lens_list, rest, pool.page_size,
            q.shape[1] // pool.layout.num_kv_heads, min_keys))
        for g in groups:
            extend_group(q, out, pool, layer, g, scale)
        grouped = {b for g in groups for b in g.rows}
        alone = [b for b in rest if b not in grouped]
        if native is not None:
            rows = batch.cached("torch.short_extends", lambda: short_extends(
                batch.page_table, starts, seq_lens, batch.prefix_lens_list, alone))
            if rows is not None:
                out[rows.tokens] = native.paged_decode(q[rows.tokens], pool.k_cache(layer),
                                                       pool.v_cache(layer), rows.pages,
                                                       rows.lens, scale)[0]
                alone = [b for b in alone if b not in rows.members]
        dtype = (torch.bfloat16 if q.dtype == torch.float32 and self.bf16_rows is not None
                 and q.shape[0] >= self.bf16_rows else q.dtype)
        for b in alone:
            seq_len, s, e = seq_lens[b], starts[b], starts[b + 1]
            k, v = kv_of(pool, layer, batch.page_table[b], seq_len, dtype)     # [L, Hkv, D]
            out[s:e] = causal_attend(q[s:e].to(dtype), k, v, batch.prefix_lens_list[b], scale)
        return out

    @staticmethod
    def _decode(q, pool: KVPool, layer: int, plan: DecodePlan, scale: float):
        """One new token per sequence. q: [B, Hq, D] -> [B, Hq, D].

        Follows the step's :class:`DecodePlan`: each bucket of similar-length sequences attends
        to its own pages; a group sharing leading pages attends to the shared part once, merged
        by log-sum-exp (cascade attention)."""
        B, Hq, D = q.shape
        Hkv = pool.layout.num_kv_heads
        qg = q.view(B, Hkv, Hq // Hkv, D)
        cascade = bool(plan.groups)
        native = native_decode(q, pool)
        if native is not None:
            o, l = native.paged_decode(q, pool.k_cache(layer), pool.v_cache(layer),
                                       plan.own.pages, plan.own.lens, scale)
            out, lse = o.view(B, Hkv, Hq // Hkv, D), l.view(B, Hkv, Hq // Hkv)
            return merge_shared(qg, out, lse, pool, layer, plan, scale, native).reshape(B, Hq, D)

        def kv(pages: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
            return kv_of(pool, layer, pages, length, q.dtype)            # [..., L, Hkv, D]

        if len(plan.buckets) == 1 and plan.buckets[0].rows is None and not cascade:
            bk = plan.buckets[0]
            out, _ = attend_lse(qg, *kv(bk.pages, bk.length), scale, bk.masked)
            return out.reshape(B, Hq, D)
        out = torch.empty_like(qg)                                       # [B, Hkv, G, D]
        lse = torch.empty(B, Hkv, Hq // Hkv) if cascade else None
        for bk in plan.buckets:
            rows = slice(None) if bk.rows is None else bk.rows
            o, l = attend_lse(qg[rows], *kv(bk.pages, bk.length), scale, bk.masked)
            out[rows] = o
            if cascade:
                lse[rows] = l
        return merge_shared(qg, out, lse, pool, layer, plan, scale).reshape(B, Hq, D)

    def copy_pages(self, pool: KVPool, src: list[int], dst: list[int]) -> None:
        pool.copy_pages(src, dst)
