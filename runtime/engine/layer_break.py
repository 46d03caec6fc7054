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

from collections.abc import Callable, Sequence

import torch

from agentlang.runtime.engine.output_processor import OutputProcessor
from agentlang.runtime.scheduler.scheduled import ScheduledItem
from agentlang.runtime.scheduler.scheduler import Scheduler


class LayerBreaks:
    """Builds the ``between_layers`` hook of a step. ``take_arrivals()`` runs the queued
    submissions and says whether there were any; ``run(items)`` computes a step's logits
    (without breaks of its own)."""

    def __init__(self, scheduler: Scheduler, processor: OutputProcessor,
                 take_arrivals: Callable[[], bool],
                 run: Callable[[Sequence[ScheduledItem]], torch.Tensor]):
        self.scheduler = scheduler
        self.processor = processor
        self.take_arrivals = take_arrivals
        self.run = run
        self.steps = 0           # break steps run (``agentlang_layer_break_steps_total``)

    def hook(self, items: Sequence[ScheduledItem]) -> Callable[[], None]:
        """The hook for the step of ``items`` (call before its forward)."""
        in_flight = [it.req for it in items]

        def between_layers() -> None:
            if not self.take_arrivals():
                return
            work = self.scheduler.admit_between_layers(in_flight)
            if work:
                self.steps += 1
                self.processor.process(work, self.run(work))

        return between_layers
