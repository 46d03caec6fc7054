"""What a verify row costs on this machine, for this model: :class:`DraftPolicy`'s ``row_cost``
measured instead of assumed.

``c = (t(R) / t(1) - 1) / (R - 1)``: the model's step for one sequence appending ``R`` tokens
after ``CONTEXT`` cached ones against one appending a single token (the shortest of ``REPS``
runs each; ``R`` = :data:`ROWS`, a 9-row verify: 8 draft tokens). It depends on the CPU far
more than a constant can say: 0.35 on 2 AVX2 cores, ~0.15 on 2 cores with AMX tiles (the
embedded model's native step, docs/benchmarks.md), and a bigger model is more memory-bound
(smaller ``c``). The run takes pages of its own from the free list and gives them back: no
request's pages, no cache entry, no output is touched.
"""

from __future__ import annotations

import logging
import time

import torch

from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVPool
from agentlang.runtime.cache.page_allocator import PageAllocator

log = logging.getLogger(__name__)

CONTEXT = 512     # cached tokens before the measured rows (or what the context limit allows)
ROWS = 9          # rows of the measured verify step
REPS = 5          # runs of each step; the shortest counts
MIN_COST = 0.02   # floor of a measurement (a timer's noise must not make rows look free)


def measure_row_cost(model: torch.nn.Module, pool: KVPool, allocator: PageAllocator, backend,
                     max_context: int) -> float | None:
    """The row cost ``c`` measured (module doc), in ``[MIN_COST, 1]``; None when it cannot be
    measured now: too few free pages, or a pool with sliding-window pages (whose own pages
    a step would need)."""
    context = min(CONTEXT, max_context - ROWS)
    ps = pool.page_size
    need = -(-(context + ROWS) // ps)
    if context < 1 or pool.windows is not None or allocator.num_free < need:
        return None
    pages = allocator.allocate(need)
    try:
        t1 = step_seconds(model, pool, backend, pages, context, 1)
        tr = step_seconds(model, pool, backend, pages, context, ROWS)
    finally:
        allocator.decref(pages)
    c = min(1.0, max(MIN_COST, (tr / t1 - 1) / (ROWS - 1)))
    log.info("speculative row cost measured: %.3f (%d rows %.2f ms, 1 row %.2f ms, after %d "
             "tokens)", c, ROWS, tr * 1e3, t1 * 1e3, context)
    return c


def step_seconds(model, pool: KVPool, backend, pages: list[int], context: int, rows: int,
                 reps: int = REPS) -> float:
    """Seconds of the shortest of ``reps`` steps of one sequence appending ``rows`` tokens
    after ``context`` cached ones on ``pages`` (one more run before them warms up, uncounted)."""
    cuda = pool.device.type == "cuda"
    times = []
    with torch.inference_mode():
        for _ in range(reps + 1):
            batch = build_forward_batch([[0] * rows], [context], [pages], pool.page_size,
                                        logits_rows=[list(range(rows))], device=pool.device)
            if cuda:
                torch.cuda.synchronize(pool.device)
            t0 = time.perf_counter()
            model(batch, pool, backend)
            if cuda:
                torch.cuda.synchronize(pool.device)
            times.append(time.perf_counter() - t0)
    return min(times[1:])
