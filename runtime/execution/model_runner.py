"""ModelRunner: turns one step's scheduled items into batch metadata and runs the model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from agentlang.runtime.attention.base import AttentionBackend
from agentlang.runtime.execution.cuda_graph import DecodeGraphs
from agentlang.runtime.attention.forward_batch import ForwardBatch, build_forward_batch
from agentlang.runtime.cache.kv_pool import KVPool
from agentlang.runtime.models.llama import LlamaModel
from agentlang.runtime.scheduler.scheduled import ScheduledItem


class ModelRunner:
    """Runs steps eagerly, or decode steps from CUDA graphs when ``graphs`` is given (see
    :mod:`agentlang.runtime.execution.cuda_graph`; steps the graphs cannot replay run eagerly)."""

    def __init__(self, model: LlamaModel, pool: KVPool, backend: AttentionBackend,
                 graphs: DecodeGraphs | None = None):
        self.model = model
        self.pool = pool
        self.backend = backend
        self.graphs = graphs
        self.tokens_run = 0
        self.forward_passes = 0

    def build_batch(self, items: Sequence[ScheduledItem]) -> ForwardBatch:
        """Metadata of one step, built once and shared by every layer."""
        return build_forward_batch(
            [it.tokens for it in items],
            [it.start for it in items],
            [it.req.page_table.pages for it in items],
            self.pool.page_size,
            logits_rows=[it.logits_rows for it in items],
            device=self.pool.device,
        )

    def run(self, items: Sequence[ScheduledItem],
            between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """Runs the step; returns logits ``[sum(len(it.logits_rows)), V]`` in item order.
        ``between_layers`` runs after each layer but the last of an eager step (a CUDA-graph
        replay has no breaks: its steps are short)."""
        batch = self.build_batch(items)
        logits = self.graphs.run(batch) if self.graphs is not None else None
        if logits is None:
            logits = self.model(batch, self.pool, self.backend, between_layers)
        self.tokens_run += batch.num_tokens
        self.forward_passes += 1
        return logits
