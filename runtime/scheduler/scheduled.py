"""What one step runs: the scheduler's output, read by the model runner and the output
processor."""

from __future__ import annotations

import os
from typing import NamedTuple

from agentlang.runtime.request.request import Request


class ScheduledItem(NamedTuple):
    req: Request
    start: int            # num_computed before this step
    tokens: list[int]     # tokens run now (all_ids[start : start + len(tokens)])
    logits_rows: list[int]  # offsets within ``tokens`` whose logits are needed

    @property
    def completes(self) -> bool:
        """The chunk reaches the end of the request's tokens (a sample follows)."""
        return self.start + len(self.tokens) == self.req.num_tokens + len(self.req.draft)


class Schedule(NamedTuple):
    """One step's work: ``items`` to run, and ``unfit`` requests that cannot fit in the KV
    pool even alone — taken out of the queues, holding nothing; the caller finishes them."""

    items: list[ScheduledItem]
    unfit: list[Request]


def tokens_of(items: list[ScheduledItem]) -> int:
    """Tokens the step of ``items`` computes."""
    return sum(len(it.tokens) for it in items)


def overlaps_inflight(ids: list[int], cached: int, inflight: list[Request],
                      min_shared: int) -> bool:
    """A waiting request's tokens ``ids`` (the first ``cached`` of them cached) share at least
    ``min_shared`` uncached tokens with a request of ``inflight`` (a prefill in flight): it
    waits a step, so the shared prefix is computed once."""
    for other in inflight:
        common = len(os.path.commonprefix([ids, other.all_ids[: other.num_tokens]]))
        if common - cached >= min_shared:
            return True
    return False
