"""Breaks between layers: a higher-priority arrival is served inside the step in flight.

Why: on a CPU a full step of 64 lower-priority decodes takes ~0.35-0.45 s, and a request that
arrives just after it started would wait for all of it before its own prefill (the step in
flight is most of its time to first token). Shortening every step instead costs throughput:
a step's time is ~60 ms fixed (the weights are read once per step) + ~4.3 ms per decode row
(SmolLM2-135M, float32, 2 threads), so halving the rows loses ~15 %.

Rule: after each layer but the last of an eager step, the stepping thread takes the
submissions that arrived since (:meth:`StepLoop.take_arrivals`; aborts and other changes
still wait for the next step). If any arrived and some waiting request's rank is above the
lowest effective priority in the step in flight (:meth:`PriorityPolicy.outranking`), those
requests are admitted (:meth:`Scheduler.admit_between_layers`: no preemption, at most
``urgent_slots`` above ``max_running``) and their step — prefill and first sample — runs
whole, there and then; the paused step then resumes with its next layer. With equal
priorities nothing outranks the step in flight: no break step ever runs.

Why it is sound: the paused step's requests keep their pages, locks and page reservations
(reserved before its forward; they are not preempted, finished or aborted during the break),
and the break step writes only pages its own requests reserved, so neither batch reads or
writes the other's KV. Every request's tokens are computed from the same KV either way:
greedy outputs do not change. The paused step's requests advance when it finishes, as usual.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import torch

from agentlang.runtime.engine.output_processor import OutputProcessor
from agentlang.runtime.scheduler.scheduled import ScheduledItem
from agentlang.runtime.scheduler.scheduler import Scheduler


class BetweenLayers:
    """A step's ``between_layers`` hook; ``pending`` (a ``ctypes.c_int32``, or None) is nonzero
    while arrivals wait: a model that runs its layers natively in one call stops between two
    of them only then (calling the hook with none would do nothing)."""

    def __init__(self, breaks: LayerBreaks, in_flight: list, pending: ctypes.c_int32 | None):
        self.breaks = breaks
        self.in_flight = in_flight
        self.pending = pending

    def __call__(self) -> None:
        b = self.breaks
        if not b.take_arrivals():
            return
        work = b.scheduler.admit_between_layers(self.in_flight)
        if work:
            b.steps += 1
            b.processor.process(work, b.run(work))


class LayerBreaks:
    """Builds the ``between_layers`` hook of a step. ``take_arrivals()`` runs the queued
    submissions and says whether there were any (``pending``: the flag set while some wait,
    or None); ``run(items)`` computes a step's logits (without breaks of its own)."""

    def __init__(self, scheduler: Scheduler, processor: OutputProcessor,
                 take_arrivals: Callable[[], bool],
                 run: Callable[[Sequence[ScheduledItem]], torch.Tensor],
                 pending: ctypes.c_int32 | None = None):
        self.scheduler = scheduler
        self.processor = processor
        self.take_arrivals = take_arrivals
        self.run = run
        self.pending = pending
        self.steps = 0           # break steps run (``agentlang_layer_break_steps_total``)

    def hook(self, items: Sequence[ScheduledItem]) -> BetweenLayers:
        """The hook for the step of ``items`` (call before its forward)."""
        return BetweenLayers(self, [it.req for it in items], self.pending)
