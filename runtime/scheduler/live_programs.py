"""The live-program limit of schedule policy ``live`` (``continue``'s order plus this gate).

A program (``core.program_service.program_of``: a session, else an agent label, else the
request) is *live* while it has a running request or a session hold (``cache.retention``):
while its KV is wanted in the pool. When the pool is short, admitting one more program only
makes the live ones evict each other's histories (a paused agent's history released under
pressure is recomputed on its next turn), so the number of live programs is limited, and the
limit is learnt from pressure:

* it starts at ``ceiling`` (the scheduler's ``max_running``: no limit);
* when a hold was released for ``pressure`` or ``cap``, or a request was preempted, since the
  last step, it falls to the number of programs live now (the one that lost its KV no
  longer counts);
* otherwise it grows by one for each program that stopped being live since the last step (it
  finished, or its hold ran out), up to ``ceiling``.

A waiting request of a program that is not live is admitted only while fewer than ``limit``
programs are live, or when nothing runs (no one else would make progress). Requests of live
programs (an agent's next turn, a preempted request's siblings) are never held back. The
scheduler lets requests that outrank a running one past it (a higher priority never waits for
it). With any other policy the gate is open. Stepping thread only.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from agentlang.runtime.cache.retention import Retention
from agentlang.runtime.core.program_service import program_of

PRESSURE_REASONS = ("pressure", "cap")   # hold releases that mean the pool is short


class LiveGate:
    """One step's admission test (:meth:`LivePrograms.gate`)."""

    def __init__(self, live: set[Hashable] | None, limit: int, idle: bool):
        self.live, self.limit, self.idle = live, limit, idle   # live None: the gate is open

    def allows(self, req: Any) -> bool:
        return self.live is None or self.idle or len(self.live) < self.limit \
            or program_of(req) in self.live

    def admitted(self, req: Any) -> None:
        if self.live is not None:
            self.live.add(program_of(req))
            self.idle = False


class LivePrograms:
    """The limit and what it learnt from (module doc); ``enabled`` False: always open."""

    def __init__(self, ceiling: int, enabled: bool):
        self.ceiling = self.limit = ceiling
        self.enabled = enabled
        self.lowered = 0                          # times pressure lowered the limit
        self._held: dict[Hashable, Hashable] = {}   # hold key -> its program
        self._live: set[Hashable] = set()
        self._pressure = 0

    @property
    def live_now(self) -> int:
        """Programs live after the last gate's admissions (0 with the gate disabled)."""
        return len(self._live)

    def held(self, key: Hashable, req: Any) -> None:
        """``req``'s program keeps its KV under the retention hold ``key``."""
        if self.enabled:
            self._held[key] = program_of(req)

    def gate(self, running: Iterable[Any], retention: Retention, preemptions: int) -> LiveGate:
        """The gate of the step about to be scheduled; updates the limit first. The gate's
        live set, grown by its admissions, is what the next call compares with."""
        if not self.enabled:
            return LiveGate(None, self.limit, False)
        running = list(running)
        keys = {h.key for h in retention.holds()}
        self._held = {k: p for k, p in self._held.items() if k in keys}
        live = {program_of(r) for r in running} | set(self._held.values())
        pressure = preemptions + sum(retention.stats.released[r] for r in PRESSURE_REASONS)
        if pressure > self._pressure:
            self.limit = max(1, len(live))
            self.lowered += 1
        else:
            self.limit = min(self.ceiling, self.limit + len(self._live - live))
        self._pressure, self._live = pressure, live
        return LiveGate(live, self.limit, not running)
