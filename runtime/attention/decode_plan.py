"""How a decode step's attention reads the KV pool: computed once per step, used by every layer.

A decode step appends one token to each of ``B`` sequences. The torch backend reads each
sequence's context through its page table; which pages, how much padding and which
sequences share leading pages depend only on the batch, never on the layer. So the host-side
work (Python loops over sequences, small index tensors) is done here once per step
(:func:`decode_plan`), instead of once per layer; the per-layer code only gathers and
multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SHARED_PAGES = 2     # shorter shared prefixes are not worth a separate pass
# Where the native kernel reads each row's pages in place, a cascade group (its shared part
# gathered and attended once, merged by log-sum-exp: ~10 torch ops a layer) pays only when its
# members' shared keys add up to this many; measured on 2 AVX-512 cores, 9 / 3 heads of 64
# (issue 29): bf16 1k shared keys x 27 rows 0.73 vs 0.98 ms as rows, 256 x 27 0.37 vs 0.30 ms;
# float32 rows were faster up to 1k x 64.
CASCADE_MIN_KEYS = {torch.bfloat16: 16_384, torch.float32: 131_072}


def cascade_min_keys(dtype: torch.dtype, native: bool) -> int:
    """The shared keys (shared tokens x members) a decode cascade group needs in a step of
    ``dtype`` queries: 0 without the native kernel (torch's gathered buckets re-read a shared
    prefix per row, so any group of :data:`MIN_SHARED_PAGES` pays)."""
    return CASCADE_MIN_KEYS.get(dtype, 0) if native else 0


@dataclass(frozen=True)
class Bucket:
    """Sequences of similar own-context length, attended together (padded to ``length``)."""
    rows: torch.Tensor | None   # [b] int64 batch rows, or None for "all rows, in order"
    pages: torch.Tensor         # [b, n] int64 page ids of each row's own (unshared) part
    length: int                 # L: longest own context in the bucket (keys per row)
    masked: torch.Tensor | None  # [b, 1, 1, L] bool, True on padding keys, or None (no padding)


@dataclass(frozen=True)
class SharedGroup:
    """Sequences whose first ``pages.numel()`` pages are the same pages (cascade attention)."""
    rows: torch.Tensor          # [m] int64 batch rows
    pages: torch.Tensor         # [n] int64 shared page ids
    everyone: bool = False      # the rows are all the batch's, in order
    first_page: int | None = None   # pages[0] when the pages are consecutive ids (a run)


def shared_group(rows: list[int], pages: torch.Tensor, batch: int) -> SharedGroup:
    """The :class:`SharedGroup` of batch rows ``rows`` over ``pages`` [n] (of ``batch`` rows)."""
    run = pages.numel() == 1 or bool((pages[1:] - pages[:-1] == 1).all())
    return SharedGroup(torch.tensor(rows), pages, rows == list(range(batch)),
                       int(pages[0]) if run else None)


@dataclass(frozen=True)
class OwnPages:
    """Every row's own (unshared) part as the native kernel reads it, in batch order."""
    pages: torch.Tensor         # [B, n] int64: each row's own pages, in order (padded: unread)
    lens: torch.Tensor          # [B] int64: own keys of each row (>= 1: its new token)


@dataclass(frozen=True)
class DecodePlan:
    buckets: tuple[Bucket, ...]
    groups: tuple[SharedGroup, ...]
    own: OwnPages


def decode_plan(page_table: torch.Tensor, seq_lens: list[int], page_size: int,
                min_keys: int = 0) -> DecodePlan:
    """The plan of a decode step. page_table: [B, max_pages]; seq_lens[b] includes the new
    token; ``min_keys``: see :func:`shared_prefix_groups`."""
    shared, groups = shared_prefix_groups(page_table, seq_lens, page_size, min_keys)
    own_lens = [n - s * page_size for n, s in zip(seq_lens, shared)]
    table = page_table.long()
    B = len(seq_lens)
    buckets = []
    for rows in length_buckets(own_lens):
        L = max(own_lens[b] for b in rows)
        n = (L + page_size - 1) // page_size
        everyone = rows == list(range(B))                # all rows, already in order
        if not any(shared[b] for b in rows):
            pages = (table if everyone else table[rows])[:, :n]                  # [b, n]
        else:
            cols = (torch.tensor([shared[b] for b in rows])[:, None] + torch.arange(n)[None, :])
            pages = table[rows].gather(1, cols.clamp_(max=table.shape[1] - 1))   # [b, n]
        lens = [own_lens[b] for b in rows]
        masked = None
        if min(lens) < L:
            masked = (torch.arange(L)[None, :] >= torch.tensor(lens)[:, None])[:, None, None, :]
        buckets.append(Bucket(None if everyone else torch.tensor(rows), pages.contiguous(), L,
                              masked))
    width = (max(own_lens) + page_size - 1) // page_size
    cols = (torch.tensor(shared)[:, None] + torch.arange(width)[None, :]).clamp_(
        max=table.shape[1] - 1)
    own = OwnPages(table.gather(1, cols), torch.tensor(own_lens, dtype=torch.int64))
    return DecodePlan(tuple(buckets), tuple(shared_group(rows, table[rows[0], :n], B)
                                            for rows, n in groups), own)


def shared_prefix_groups(table: torch.Tensor, seq_lens: list[int], page_size: int,
                         min_keys: int = 0, queries: list[int] | None = None
                         ) -> tuple[list[int], list[tuple[list[int], int]]]:
    """Groups of decode sequences whose leading pages are the same pages: at least
    :data:`MIN_SHARED_PAGES` of them, and ``min_keys`` shared keys over all members' query
    tokens (``queries[b]`` each, default 1; :func:`cascade_min_keys`).

    Returns (shared pages per sequence, [(member rows, shared pages)]). A sequence's own
    newest token is never inside the shared part.
    """
    B = table.shape[0]
    shared = [0] * B
    groups: list[tuple[list[int], int]] = []
    by_first: dict[int, list[int]] = {}
    firsts = table[:, 0].tolist()
    for b in range(B):
        if seq_lens[b] > page_size:
            by_first.setdefault(firsts[b], []).append(b)
    for rows in by_first.values():
        if len(rows) < 2:
            continue
        limit = min((seq_lens[b] - 1) // page_size for b in rows)
        sub = table[rows, :limit]
        same = (sub == sub[:1]).all(dim=0).int().cumprod(0)
        n = int(same.sum())
        asking = len(rows) if queries is None else sum(queries[b] for b in rows)
        if n >= MIN_SHARED_PAGES and n * page_size * asking >= min_keys:
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
