"""CUDA-graph decode: a decode step replayed from a graph captured once per batch-size bucket.

A decode step of ``B`` sequences runs in the graph of the smallest bucket ``b >= B`` (buckets
1, 2, 4, ..., 256, capped by the engine's ``max_running``). Each graph reads its inputs from
*static buffers* that live as long as the graphs: before a replay the step's metadata is
copied into rows ``[0, B)`` and rows ``[B, b)`` are set to *padding rows*, which read and write
only the padding page (one page held from the allocator for this purpose, never in a
request or the radix cache): input id 0 at position 0, ``seq_len`` 1, page table ``[pad, 0,
...]``, slot ``pad * page_size``. Every op of the model is row-wise except attention, which
reads each row's own pages, so padding rows do not change the real rows' outputs.

What runs eagerly instead (no error): prefill/mixed steps, batches above the largest bucket,
contexts beyond ``max_pages``, and every step after a capture failed (warned once).

A graph bakes the host values its launches were given: the static batch's host lists
(``seq_lens_list``) hold the worst case (``max_pages * page_size`` tokens) while capturing, so
kernels sized from them (decode's split count) cover every later replay. Only backends whose
launches read nothing else from the host (``graph_safe``) may be captured.

The capture itself is injectable (:class:`GraphCapture`): :class:`CudaGraphCapture` on a GPU;
CPU dry runs and tests use :class:`RerunCapture`, whose "graph" re-runs the captured callable
on the same static buffers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from agentlang.runtime.attention.base import AttentionBackend
from agentlang.runtime.attention.forward_batch import ForwardBatch
from agentlang.runtime.cache.kv_pool import KVPool
from agentlang.runtime.cache.page_allocator import PageAllocator

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class CapturedGraph(Protocol):
    def replay(self) -> None:
        """Re-execute the captured work on the same buffers (outputs written in place)."""


class GraphCapture(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[CapturedGraph, torch.Tensor]:
        """Record ``fn`` (warming it up first if needed); returns the graph and ``fn``'s output
        tensor, which every ``replay()`` overwrites. May raise: the caller falls back to eager."""


class CudaGraphCapture:
    """``torch.cuda.CUDAGraph`` capture; all graphs share one memory pool (they never run
    concurrently, and their outputs stay alive, so intermediates can share memory)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[CapturedGraph, torch.Tensor]:
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):      # warm-up: Triton JIT, cuBLAS handles, lazy init
            fn()
        main.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out


class RerunCapture:
    """A capture whose "graph" re-runs the callable on the same buffers and copies the result
    into the first run's output: CUDA-graph semantics without CUDA, for CPU dry runs and tests
    (the static batch's host lists follow each load, so any backend works)."""

    def __init__(self) -> None:
        self.captures = 0

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[CapturedGraph, torch.Tensor]:
        out = fn()
        self.captures += 1
        return _Rerun(fn, out), out


class _Rerun:
    def __init__(self, fn: Callable[[], torch.Tensor], out: torch.Tensor):
        self.fn, self.out = fn, out

    def replay(self) -> None:
        self.out.copy_(self.fn())


def choose_buckets(max_batch: int, buckets: Sequence[int] = BUCKETS) -> tuple[int, ...]:
    """The buckets an engine running at most ``max_batch`` sequences uses: every bucket below it
    and the first one at or above it (all of them when ``max_batch`` exceeds the largest)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
    ordered = sorted(set(buckets))
    if not ordered or ordered[0] < 1:
        raise ValueError(f"buckets must be positive batch sizes, got {list(buckets)!r}")
    kept = [b for b in ordered if b < max_batch]
    kept += [b for b in ordered if b >= max_batch][:1]
    return tuple(kept)


def bucket_for(batch_size: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket holding ``batch_size`` sequences; None above the largest."""
    return next((b for b in buckets if b >= batch_size), None)


class StaticDecodeBatch:
    """The static buffers every decode graph reads (rows ``[0, max_batch)``), and one
    :class:`ForwardBatch` view of their first ``b`` rows per bucket."""

    def __init__(self, max_batch: int, max_pages: int, page_size: int, pad_page: int,
                 device: torch.device):
        self.max_pages, self.page_size, self.pad_page = max_pages, page_size, pad_page
        n = max_batch
        with torch.inference_mode():
            self.input_ids = torch.zeros(n, dtype=torch.long, device=device)        # [n]
            self.positions = torch.zeros(n, dtype=torch.long, device=device)        # [n]
            self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)         # [n]
            self.prefix_lens = torch.zeros(n, dtype=torch.int32, device=device)     # [n]
            self.q_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)  # [n+1]
            self.page_table = torch.zeros(n, max_pages, dtype=torch.int32, device=device)
            self.slot_mapping = torch.zeros(n, dtype=torch.long, device=device)     # [n]
            self.logits_indices = torch.arange(n, dtype=torch.long, device=device)  # [n]
        self.pad_rows(0, n)

    @torch.inference_mode()
    def pad_rows(self, start: int, end: int) -> None:
        """Make rows ``[start, end)`` padding rows: they read and write only the padding page.
        A capture runs on padding rows only, so its warm-up run writes no request's K/V."""
        self.input_ids[start:end].zero_()
        self.positions[start:end].zero_()
        self.seq_lens[start:end].fill_(1)
        self.prefix_lens[start:end].zero_()
        self.slot_mapping[start:end].fill_(self.pad_page * self.page_size)
        self.page_table[start:end].zero_()
        self.page_table[start:end, 0] = self.pad_page

    def view(self, b: int) -> ForwardBatch:
        """Rows ``[0, b)`` as a batch whose host lists hold the capture's worst case."""
        worst = self.max_pages * self.page_size
        return ForwardBatch(
            input_ids=self.input_ids[:b], positions=self.positions[:b],
            seq_lens=self.seq_lens[:b], prefix_lens=self.prefix_lens[:b],
            q_start_loc=self.q_start_loc[:b + 1], page_table=self.page_table[:b],
            slot_mapping=self.slot_mapping[:b], logits_indices=self.logits_indices[:b],
            page_size=self.page_size, seq_lens_list=[worst] * b,
            prefix_lens_list=[worst - 1] * b,
        )

    @torch.inference_mode()
    def load(self, batch: ForwardBatch, view: ForwardBatch) -> None:
        """Copy decode ``batch`` (``B`` rows) into rows ``[0, B)`` and make rows ``[B, b)`` of
        ``view`` padding rows; the view's host lists follow (read only by ``RerunCapture``)."""
        B, b, w = batch.batch_size, view.batch_size, batch.page_table.shape[1]
        self.input_ids[:B].copy_(batch.input_ids)
        self.positions[:B].copy_(batch.positions)
        self.seq_lens[:B].copy_(batch.seq_lens)
        self.prefix_lens[:B].copy_(batch.prefix_lens)
        self.slot_mapping[:B].copy_(batch.slot_mapping)
        self.page_table[:B].zero_()
        self.page_table[:B, :w].copy_(batch.page_table)
        if b > B:
            self.pad_rows(B, b)
        view.seq_lens_list = list(batch.seq_lens_list) + [1] * (b - B)
        view.prefix_lens_list = list(batch.prefix_lens_list) + [0] * (b - B)
        view.forget_derived()


class DecodeGraphs:
    """Decode steps replayed from per-bucket graphs, captured lazily at a bucket's first use.

    ``run(batch)`` returns the logits ``[B, V]`` (a fresh tensor) of a decode batch it can
    replay, or None when the caller must run the step eagerly. A capture that raises disables
    the graphs for good, with one ``RuntimeWarning``; outputs never come from a failed graph.
    ``forward(batch)`` is the model call captured (``model(batch, pool, backend)``).
    """

    def __init__(self, forward: Callable[[ForwardBatch], torch.Tensor], capture: GraphCapture,
                 static: StaticDecodeBatch, buckets: Sequence[int]):
        self.forward = forward
        self.capturer = capture
        self.static = static
        self.buckets = tuple(sorted(buckets))
        self.graphs: dict[int, tuple[CapturedGraph, torch.Tensor, ForwardBatch]] = {}
        self.disabled: str | None = None
        self.replays = 0
        self.eager_fallbacks = 0

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def eligible(self, batch: ForwardBatch) -> bool:
        """A decode batch (one new token and one logits row per sequence) within the largest
        bucket and the static page-table width."""
        return (self.disabled is None and batch.is_decode
                and batch.batch_size <= self.max_batch
                and int(batch.logits_indices.shape[0]) == batch.batch_size
                and batch.page_table.shape[1] <= self.static.max_pages
                and batch.page_size == self.static.page_size)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor | None:
        if not self.eligible(batch):
            self.eager_fallbacks += 1
            return None
        b = bucket_for(batch.batch_size, self.buckets)
        assert b is not None  # eligible() bounds the batch size
        entry = self.graphs.get(b) or self._capture(b)
        if entry is None:
            self.eager_fallbacks += 1
            return None
        graph, out, view = entry
        self.static.load(batch, view)
        graph.replay()
        self.replays += 1
        return out[:batch.batch_size].clone()                   # [B, V]

    def _capture(self, b: int) -> tuple[CapturedGraph, torch.Tensor, ForwardBatch] | None:
        view = self.static.view(b)
        self.static.pad_rows(0, b)
        try:
            graph, out = self.capturer.capture(lambda: self.forward(view))
        except Exception as e:  # noqa: BLE001 - any capture failure means: run eagerly
            self.disabled = f"capture of batch bucket {b} failed: {type(e).__name__}: {e}"
            warnings.warn(f"CUDA-graph decode disabled, running eagerly ({self.disabled})",
                          RuntimeWarning, stacklevel=3)
            self.graphs.clear()
            return None
        self.graphs[b] = (graph, out, view)
        return self.graphs[b]


def make_decode_graphs(setting: bool | None, model: torch.nn.Module, pool: KVPool,
                       backend: AttentionBackend, allocator: PageAllocator, max_batch: int,
                       max_context: int, capture: GraphCapture | None = None
                       ) -> DecodeGraphs | None:
    """The engine's decode graphs, or None when they are off.

    ``setting`` (``EngineConfig.cuda_graph``): None = on for CUDA with a graph-safe backend,
    off otherwise; True on a device or backend that cannot capture raises ``ValueError``.
    ``capture`` overrides the CUDA capture (e.g. :class:`RerunCapture`, which works on CPU and
    with any backend).
    Holds one page of ``allocator`` as the padding page for the graphs' lifetime.
    """
    if setting is not None and not isinstance(setting, bool):
        raise ValueError(f"cuda_graph must be True, False or None (auto), got {setting!r}")
    on_cuda = pool.device.type == "cuda"
    safe = bool(getattr(backend, "graph_safe", False))
    if setting is None:
        setting = on_cuda and safe and pool.windows is None
    if not setting:
        return None
    if pool.windows is not None:    # sliding layers attend per sequence (attention/window.py)
        raise ValueError("cuda_graph=True: sliding-window models (Gemma 2 / 3) are not captured")
    if capture is None and not on_cuda:
        raise ValueError(f"cuda_graph=True needs device 'cuda', got {pool.device.type!r}")
    if not safe and capture is None:
        raise ValueError(f"cuda_graph=True needs a graph-safe attention_backend ('triton'), "
                         f"got {backend.name!r}")
    buckets = choose_buckets(max_batch)
    tokens = min(max_context, pool.capacity_tokens)
    max_pages = max(1, -(-tokens // pool.page_size))
    pad = allocator.allocate(1)[0]
    static = StaticDecodeBatch(buckets[-1], max_pages, pool.page_size, pad, pool.device)
    return DecodeGraphs(lambda batch: model(batch, pool, backend),
                        capture or CudaGraphCapture(pool.device), static, buckets)
