"""Greedy decoding straight through the model (no scheduler): prompts prefilled one by one,
then decode steps over chosen rows, each run from CUDA graphs when given or eagerly. Used to
compare graph and eager decoding token for token (``bench/gpu_llama8b.py``, the tests)."""

from __future__ import annotations

import torch

from agentlang.runtime.execution.cuda_graph import DecodeGraphs
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVPool
from agentlang.runtime.cache.page_allocator import PageAllocator


class GreedyDecoder:
    """Sequences over one pool, pages taken from ``allocator`` as tokens arrive and given back
    by ``release()``. ``tokens[b]``: sequence ``b``'s greedy tokens so far; ``lens[b]``: its
    tokens stored in the pool."""

    def __init__(self, model, pool: KVPool, backend, allocator: PageAllocator,
                 graphs: DecodeGraphs | None = None):
        self.model, self.pool, self.backend = model, pool, backend
        self.alloc, self.graphs = allocator, graphs
        self.pages: list[list[int]] = []
        self.lens: list[int] = []
        self.tokens: list[list[int]] = []

    def _cover(self, b: int, n: int) -> None:
        S = self.pool.page_size
        need = -(-(self.lens[b] + n) // S) - len(self.pages[b])
        self.pages[b] += self.alloc.allocate(max(0, need))

    def prefill(self, prompts: list[list[int]]) -> None:
        for p in prompts:
            self.pages.append([])
            self.lens.append(0)
            self.tokens.append([])
            self._cover(len(self.pages) - 1, len(p))
            batch = build_forward_batch([p], [0], [self.pages[-1]], self.pool.page_size,
                                        device=self.pool.device)
            logits = self.model(batch, self.pool, self.backend)
            self.lens[-1] = len(p)
            self.tokens[-1].append(int(logits[0].argmax()))

    def decode(self, rows: list[int]) -> torch.Tensor:
        """One decode step of sequences ``rows``; returns its logits ``[len(rows), V]``."""
        for b in rows:
            self._cover(b, 1)
        batch = build_forward_batch([[self.tokens[b][-1]] for b in rows],
                                    [self.lens[b] for b in rows], [self.pages[b] for b in rows],
                                    self.pool.page_size, device=self.pool.device)
        logits = self.graphs.run(batch) if self.graphs is not None else None
        if logits is None:
            logits = self.model(batch, self.pool, self.backend)
        best = logits.argmax(-1).tolist()
        for i, b in enumerate(rows):
            self.lens[b] += 1
            self.tokens[b].append(best[i])
        return logits

    def sequence_kv(self, b: int) -> torch.Tensor:
        """K and V of sequence ``b``'s stored tokens in order: [layers, 2, lens[b], Hkv, D]."""
        kv = self.pool.buffer[:, :, torch.tensor(self.pages[b], device=self.pool.device)]
        return kv.flatten(2, 3)[:, :, :self.lens[b]]          # [L, 2, n*S, Hkv, D] cut

    def real_pages(self) -> list[int]:
        return sorted(p for pages in self.pages for p in pages)

    def release(self) -> None:
        for pages in self.pages:
            self.alloc.decref(pages)
        self.pages, self.lens, self.tokens = [], [], []
