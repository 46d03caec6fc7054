"""Batch metadata for one forward pass over sequences of different lengths.

Every step runs a *flattened* batch: the new tokens of all sequences concatenated
(``T`` tokens in all, ``B`` sequences). Sequence ``b`` already has ``prefix_lens[b]`` tokens in
the KV pool and appends ``extend_lens[b] = seq_lens[b] - prefix_lens[b]`` new ones (1 for a
decode, more for a prefill chunk). K/V of the new tokens are written into ``slot_mapping`` and
attention then reads the whole context of each sequence through ``page_table``.

Built once per step by :func:`build_forward_batch`; every layer and every attention backend
reads the same object.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor     # [T] int64, new tokens of all sequences, concatenated
    positions: torch.Tensor     # [T] int64, absolute position of each new token
    seq_lens: torch.Tensor      # [B] int32, tokens in the pool after this step (prefix + new)
    prefix_lens: torch.Tensor   # [B] int32, tokens already in the pool before this step
    q_start_loc: torch.Tensor   # [B+1] int32, offsets of each sequence's new tokens in [T]
    page_table: torch.Tensor    # [B, max_pages] int32, page ids (padding entries are 0)
    slot_mapping: torch.Tensor  # [T] int64, pool slot (page*page_size + offset) per new token
    logits_indices: torch.Tensor  # [N] int64, rows of [T] whose logits are wanted
    page_size: int
    # Host copies (python lists) so backends can loop without device syncs.
    seq_lens_list: list[int]
    prefix_lens_list: list[int]
    # Per-step facts a backend derives from this batch (e.g. a decode plan), by key.
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()`` computed once per batch (the first layer) and returned to every layer."""
        if key not in self.memo:
            self.memo[key] = build()
        return self.memo[key]

    def forget_derived(self) -> None:
        """Drop what :meth:`cached` holds: call after changing this batch's contents in place."""
        self.memo.clear()

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        """True when every sequence appends exactly one token."""
        return self.num_tokens == self.batch_size

    @property
    def extend_lens_list(self) -> list[int]:
        return [s - p for s, p in zip(self.seq_lens_list, self.prefix_lens_list)]


def build_forward_batch(
    new_tokens: Sequence[Sequence[int]],
    prefix_lens: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    page_size: int,
    logits_rows: Sequence[Sequence[int]] | None = None,
    device: str | torch.device = "cpu",
) -> ForwardBatch:
    """Build the metadata of one step.

    ``new_tokens[b]``: the tokens sequence ``b`` appends now (non-empty).
    ``prefix_lens[b]``: tokens of ``b`` already stored in the pool.
    ``page_tables[b]``: the pages of ``b`` in order; they must cover prefix + new tokens.
    ``logits_rows[b]``: offsets within ``new_tokens[b]`` whose logits are wanted
    (default: the last one only).
    """
    B = len(new_tokens)
    if not (len(prefix_lens) == len(page_tables) == B) or B == 0:
        raise ValueError("build_forward_batch: need the same non-zero number of sequences everywhere")
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    starts = [0]
    seq_lens: list[int] = []
    logit_idx: list[int] = []
    for b in range(B):
        toks, p0, pages = new_tokens[b], prefix_lens[b], page_tables[b]
        n = len(toks)
        assert n > 0, "a sequence in the batch has no new token"
        assert len(pages) * page_size >= p0 + n, "page table does not cover the sequence"
        ids.extend(toks)
        for i in range(p0, p0 + n):
            pos.append(i)
            slots.append(pages[i // page_size] * page_size + i % page_size)
        rows = logits_rows[b] if logits_rows is not None else [n - 1]
        logit_idx.extend(starts[-1] + r for r in rows)
        starts.append(starts[-1] + n)
        seq_lens.append(p0 + n)
    max_pages = max(1, max((s + page_size - 1) // page_size for s in seq_lens))
    table = torch.zeros(B, max_pages, dtype=torch.int32)
    for b, pages in enumerate(page_tables):
        k = (seq_lens[b] + page_size - 1) // page_size
        table[b, :k] = torch.tensor(list(pages[:k]), dtype=torch.int32)
    dev = torch.device(device)
    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.long, device=dev),
        positions=torch.tensor(pos, dtype=torch.long, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        prefix_lens=torch.tensor(list(prefix_lens), dtype=torch.int32, device=dev),
        q_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        page_table=table.to(dev),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
        logits_indices=torch.tensor(logit_idx, dtype=torch.long, device=dev),
        page_size=page_size,
        seq_lens_list=seq_lens,
        prefix_lens_list=list(prefix_lens),
    )
