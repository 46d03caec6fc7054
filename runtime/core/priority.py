"""Request priorities: the accepted range, the ordering key, the aging rule and the choice of
preemption victims. The scheduler asks this module; it holds no queue of its own.

Direction (one for every API): a higher ``priority`` is served first, as in SGLang. With
``low_values_first`` (the server's ``--schedule-low-priority-values-first``, vLLM's habit) a
lower value is served first instead; :meth:`PriorityPolicy.rank` maps both to "higher rank
first". Accepted values: integers in ``[PRIORITY_MIN, PRIORITY_MAX]`` (a signed 32-bit int),
default 0.

Aging rule (replaces the old "waited ``max_wait_steps`` steps ⇒ goes first" jump): every
``age_steps`` steps a request spends waiting raise its *effective* priority by one::

    effective = rank(priority) + wait_steps // age_steps

``wait_steps`` counts every step the request spent in the waiting queue over its whole life
(preempted and requeued included) and is not reset at admission, so an aged request keeps its
rank while it runs. Consequences:

- with equal priorities it is the old rule: a request that waited ``age_steps`` steps goes
  ahead of every fresh one (which are ordered by cached prefix);
- starvation bound: a request whose rank is ``gap`` below the highest rank arriving after it
  outranks every such arrival after at most ``(gap + 1) * age_steps`` waiting steps; from then
  on none of them is admitted before it or preempts it once it runs. Pick small priority gaps (e.g. 0 and
  10) when low priorities must make progress under sustained high-priority load.

Preemption: a waiting request whose rank is above the effective priority of some running
request first takes a free slot or one of the scheduler's ``urgent_slots`` above
``max_running``; with none left (or pages short) it may take the slot and pages of running
requests whose effective priority is strictly below its own (un-aged) rank; the victim is the lowest effective
priority, newest admission first (its KV goes into the radix cache and it is recomputed later,
mostly from there). Aging protects running requests but never makes a waiting one preempt:
with equal priorities nothing is preempted for ordering, as before, and an aged request that
outranks the arrivals is first in line when a slot frees (running requests are bounded by
their ``max_tokens``).

Urgent steps (what keeps a high-priority time to first token short under load): while a
request needs more than a decode (it waits, or has a prefill chunk left) and some request
present has a lower effective priority than its rank, the step is *urgent* for the highest such
rank ``top`` (:meth:`PriorityPolicy.urgent_rank`). It first schedules the requests whose
effective priority is at least ``top`` (running work, then admissions) within the step budget
less ``min(L, max_batch_tokens // 2)``, then gives everything below ``top`` at most ``L``
tokens (``L`` = the scheduler's ``max_lower_priority_tokens``; running work oldest admission
first, then admissions). So the step that computes the high-priority prefill is about as
short as on an idle server, the request is not held behind lower-priority prefill chunks of
earlier admissions, and a running lower-priority request still progresses (oldest first);
aging lifts a waiting one to ``top`` as above. With equal priorities no step is urgent:
scheduling is exactly as without priorities.

Admission order of waiting requests (:meth:`PriorityPolicy.admission_key`), rule by rule:
(1) higher effective priority (priority + aging); (2) with the ``program`` schedule policy
the request whose program has received less service so far
(:mod:`agentlang.runtime.core.program_service`, Autellix's PLAS rule), with ``continue`` the
one whose program has received more (programs under way finish first; aging still admits a
new one that waited ``age_steps`` steps); (3) longer cached prefix; (4) fewer tokens left to
compute (shortest prefill first: among requests that arrive together it lowers the mean time
to first token, as shortest-job-first lowers mean completion time, and leaves the last one's
where it was: the prefill work is the same; aging in rule (1) keeps a long prompt from waiting
behind a stream of short ones for more than ``age_steps`` steps a level); (5) arrival. Running
requests are not reordered by it (they run oldest admission first), and preemption stays by
priority only.

Breaks between layers (``agentlang.runtime.engine.layer_break``; the step in flight): a request arriving while
a step runs is served between its layers if its rank is above the lowest effective priority
in that step (:meth:`PriorityPolicy.outranking`); equal priorities never break a step.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentlang.runtime.core.program_service import PROGRAM_ORDER, ProgramService

PRIORITY_MIN = -(2 ** 31)
PRIORITY_MAX = 2 ** 31 - 1


def check_priority(value: Any, field: str = "priority") -> int:
    """``value`` if it is an int in the accepted range, else ValueError naming ``field``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{field}: must be an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}], "
                         f"got {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(f"{field}: must be in [{PRIORITY_MIN}, {PRIORITY_MAX}] (a signed "
                         f"32-bit integer), got {value!r}")
    return value


class Prioritized(Protocol):
    """What the policy reads from a request (``agentlang.runtime.request.request.Request`` satisfies it)."""

    priority: int
    wait_steps: int
    admit_seq: int
    num_uncomputed: int      # tokens the next step(s) must run (1 = a decode)


@dataclass(frozen=True)
class PriorityPolicy:
    low_values_first: bool = False
    age_steps: int = 64
    schedule_policy: str = "lpm"          # rule (2): PROGRAM_ORDER of it (module doc)
    service: ProgramService = field(default_factory=ProgramService, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.age_steps, int) or self.age_steps < 1:
            raise ValueError(f"age_steps: must be an integer >= 1, got {self.age_steps!r}")

    def rank(self, priority: int) -> int:
        """The priority in the "higher is served first" direction."""
        return -priority if self.low_values_first else priority

    def effective(self, req: Prioritized) -> int:
        """Rank plus the aging bonus: one per ``age_steps`` steps spent waiting."""
        return self.rank(req.priority) + req.wait_steps // self.age_steps

    def admission_key(self, req: Prioritized, cached_tokens: int) -> tuple[int, int, int, int]:
        """Sort key of a waiting request (ascending = admitted first): effective priority,
        then (policy ``program`` / ``continue``) its program's attained service (ascending /
        descending), then longest cached prefix, then fewest tokens left to compute; a stable
        sort keeps arrival order."""
        order = PROGRAM_ORDER[self.schedule_policy]
        served = order * self.service.attained(req) if order else 0
        return (-self.effective(req), served, -cached_tokens,
                max(0, req.num_uncomputed - cached_tokens))

    def charge(self, req: Prioritized, tokens: int) -> None:
        """A step runs ``tokens`` of ``req``: its program's service grows (policies
        ``program`` and ``continue``)."""
        if PROGRAM_ORDER[self.schedule_policy]:
            self.service.charge(req, tokens)

    def victim(self, running: Iterable[Prioritized], below: int | None = None
               ) -> Prioritized | None:
        """The running request to preempt: lowest effective priority, newest admission first.
        With ``below``, only one whose effective priority is strictly lower (None if none)."""
        best = None
        for r in running:
            eff = self.effective(r)
            if below is not None and eff >= below:
                continue
            if best is None or (eff, -r.admit_seq) < (best[0], -best[1].admit_seq):
                best = (eff, r)
        return None if best is None else best[1]

    def urgent_rank(self, waiting: Iterable[Prioritized], running: Iterable[Prioritized]
                    ) -> int | None:
        """The rank an urgent step serves first, or None for an ordinary step: the highest
        rank among requests that need more than a decode (every waiting one; a running one
        with ``num_uncomputed > 1``), if some request present has a lower effective priority."""
        waiting, running = list(waiting), list(running)
        ranks = [self.rank(r.priority) for r in waiting] + \
                [self.rank(r.priority) for r in running if r.num_uncomputed > 1]
        if not ranks:
            return None
        top = max(ranks)
        if all(self.effective(r) >= top for r in chain(waiting, running)):
            return None
        return top

    def outranking(self, waiting: Iterable[Prioritized], in_flight: Iterable[Prioritized]
                   ) -> list[Prioritized]:
        """The waiting requests a break between the layers of a step in flight serves: those
        whose rank is above the lowest effective priority in that step (none if the step is
        empty)."""
        floor = min((self.effective(r) for r in in_flight), default=None)
        return [] if floor is None else [r for r in waiting if self.rank(r.priority) > floor]

    def make_room(self, waiting: Iterable[Prioritized], running: list[Prioritized],
                  slots: int, free_pages: int, room: "RoomCosts") -> int:
        """Preempt running requests for waiting ones that outrank them. Waiting requests are
        taken by effective priority (highest first, stable); each uses a free batch slot and
        ``room.pages_needed(req)`` of ``free_pages`` if there are enough, else the policy's
        victims whose effective priority is below the waiting request's rank are preempted (``room.preempt``, which
        must remove the victim from ``running``; ``room.pages_held`` counts what it frees)
        until it fits. Stops at the first waiting request that cannot be made to fit.
        Returns the number of requests preempted."""
        preempted = 0
        for req in sorted(waiting, key=lambda r: -self.effective(r)):
            need = room.pages_needed(req)
            while slots < 1 or free_pages < need:
                victim = self.victim(running, below=self.rank(req.priority))
                if victim is None:
                    return preempted
                free_pages += room.pages_held(victim)
                room.preempt(victim)
                preempted += 1
                slots += 1
            slots -= 1
            free_pages -= need
        return preempted


class RoomCosts(Protocol):
    """What :meth:`PriorityPolicy.make_room` needs from the scheduler."""

    def pages_needed(self, req: Any) -> int:
        """KV pages ``req`` needs to be admitted (its uncached tokens plus one)."""

    def pages_held(self, req: Any) -> int:
        """KV pages a running ``req`` releases when preempted."""

    def preempt(self, req: Any) -> None:
        """Preempt running ``req`` (remove it from the running list, requeue it)."""
