"""The live-program limit of schedule policy ``live`` (``continue``'s order plus this gate).

A program (``core.program_service.program_of``: a session, else an agent label, else the
request) is *live* while it has a running request or a session hold (``cache.retention``):
while its KV is wanted in the pool. When the pool is short, admitting one more program only
makes the live ones evict each other's histories (a paused agent's history released under
pressure is recomputed on its next turn), so the number of live programs is limited, and the
limit is learnt from pressure and from how long programs run:

* it starts at ``ceiling`` (the scheduler's ``max_running``: no limit);
* when a hold was released for ``pressure`` or ``cap``, or a request was preempted, since the
  last step, the pool is full with the live programs' KV. A program's KV grows with its turns
  (each finished turn is one more hold: :meth:`LivePrograms.held`), so the pool holds about
  ``A = Σ age`` turns, a program's *age* being its finished turns plus the one it runs. The
  limit falls to the number of programs of projected length that fit in ``A``:
  ``floor(n · A / Σ projected)`` over the ``n`` programs live now (never more than ``n``, and
  never less than ``n // 2``: one pressure event at most halves it, the estimate being rough). A
  program's projected length is the mean length of the sessions that closed so far
  (:meth:`LivePrograms.ended`; at least its age + 1), or twice its age before any closed; a
  program that never paused is projected to end with the request it runs. So a limit learnt
  when the histories are young already leaves room for their growth;
* otherwise it grows as programs stop being live (they finished, or their holds ran out): by
  one for every ``limit`` of them since the last change (one more program per round of the
  programs it lets live, as a congestion window grows), up to ``ceiling``. A faster growth
  makes the limit swing: each time it comes down again, the programs over it are shed.

While more programs are live than the limit, the paused ones over it are *shed*: their holds
are released (reason ``limit``; the lowest priority rank first, then the smallest history —
the cheapest to recompute —, then the one expected back last; pressure releases the smallest
hold first too under this policy: ``Retention.cheapest_first``). Their KV stays in the tree
as plain LRU entries, so a shed program whose pages survive loses nothing; it is no longer live, so its next turn waits at the gate instead
of growing a history that pressure would release later, and bigger.

A waiting request of a program that is not live is admitted only while fewer than ``limit``
programs are live, or when nothing runs (no one else would make progress).

The memory limit alone lets every program start while the pool has room, and programs that all
run at once share the step: each finishes only when nearly all do. For programs of similar
length the mean completion time is lowest when as few run at once as keep the step near its
peak throughput, the others waiting their turn (as programs ended one after another rather
than together). So a new *multi-call* program (a session or an agent label;
``program_service.single_call`` requests are exempt: they end with their request) starts only
while fewer than ``busy`` requests run (:func:`busy_requests`: the fewest rows at which the
step reaches :data:`BUSY_SHARE` of its peak rows per second, from the engine's row cost);
paused programs do not run, so programs waiting on tools make room for new ones and the step
stays busy. ``busy`` None: no such bound. Requests of live
programs (an agent's next turn, a preempted request's siblings) are never held back. The
scheduler lets requests that outrank a running one past it (a higher priority never waits for
it). With any other policy the gate is open. Stepping thread only.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Any

from agentlang.runtime.cache.retention import Retention
from agentlang.runtime.core.program_service import program_of, single_call

PRESSURE_REASONS = ("pressure", "cap")   # hold releases that mean the pool is short
LENGTH_MEMORY = 0.25    # weight of the newest closed session in the mean program length
MAX_PROGRAMS_REMEMBERED = 4096   # programs whose turns are counted (oldest forgotten first)
# the share of the step's peak rows per second that the requests running at once should reach
# before a new multi-call program starts (a step of R rows costs 1 + c (R - 1) one-row steps)
BUSY_SHARE = 0.8


def busy_requests(row_cost: float, share: float = BUSY_SHARE) -> int:
    """The fewest rows ``R`` whose rows per second, ``R / (1 + c (R - 1))``, reach ``share`` of
    the peak ``1 / c`` (``c``: ``row_cost`` in (0, 1]; ``share`` in (0, 1)): ``R >= share (1 -
    c) / (c (1 - share))``, at least 1. With the default row cost of 2 AVX2 cores (0.35): 8; on
    a step that is memory-bound to hundreds of rows (a GPU, ``c`` ~0.01): ~400."""
    if not 0 < row_cost <= 1 or not 0 < share < 1:
        raise ValueError(f"row_cost must be in (0, 1] and share in (0, 1), got {row_cost!r}, "
                         f"{share!r}")
    return max(1, math.ceil(share * (1 - row_cost) / (row_cost * (1 - share)) - 1e-9))


class LiveGate:
    """One step's admission test (:meth:`LivePrograms.gate`): ``running`` requests run now
    (admissions add to it); a new multi-call program needs fewer than ``busy`` (None: no
    bound)."""

    def __init__(self, live: set[Hashable] | None, limit: int, idle: bool, running: int = 0,
                 busy: int | None = None):
        self.live, self.limit, self.idle = live, limit, idle   # live None: the gate is open
        self.running, self.busy = running, busy

    def allows(self, req: Any) -> bool:
        if self.live is None or self.idle or program_of(req) in self.live:
            return True
        return len(self.live) < self.limit and \
            (self.busy is None or self.running < self.busy or single_call(req))

    def admitted(self, req: Any) -> None:
        if self.live is not None:
            self.live.add(program_of(req))
            self.idle = False
            self.running += 1


class LivePrograms:
    """The limit and what it learnt from (module doc); ``enabled`` False: always open."""

    def __init__(self, ceiling: int, enabled: bool, busy: int | None = None):
        self.ceiling = self.limit = ceiling
        self.enabled = enabled
        self.busy = busy                          # running requests before a new program starts
        self.lowered = 0                          # times pressure lowered the limit
        self.length: float | None = None          # mean turns of closed sessions
        self._keys: dict[Hashable, Hashable] = {}   # hold key -> its program (remembered)
        self._turns: dict[Hashable, int] = {}       # program -> turns finished
        self._live: set[Hashable] = set()
        self._pressure = 0
        self._ended = 0                            # programs ended since the limit changed

    @property
    def live_now(self) -> int:
        """Programs live after the last gate's admissions (0 with the gate disabled)."""
        return len(self._live)

    def held(self, key: Hashable, req: Any) -> None:
        """``req``'s program finished a turn and keeps its KV under the retention hold
        ``key``."""
        if not self.enabled:
            return
        p = program_of(req)
        self._keys.pop(key, None)
        self._keys[key] = p
        self._turns[p] = self._turns.pop(p, 0) + 1    # re-inserted last: newest remembered
        for d in (self._keys, self._turns):
            while len(d) > MAX_PROGRAMS_REMEMBERED:
                del d[next(iter(d))]

    def ended(self, key: Hashable) -> None:
        """The session holding under ``key`` closed: its turns are one program length."""
        p = self._keys.pop(key, None)
        turns = self._turns.pop(p, None) if p is not None else None
        if turns:
            self.length = turns if self.length is None else \
                LENGTH_MEMORY * turns + (1 - LENGTH_MEMORY) * self.length

    def gate(self, running: Iterable[Any], retention: Retention, preemptions: int) -> LiveGate:
        """The gate of the step about to be scheduled; updates the limit and sheds the paused
        programs over it first. The gate's live set, grown by its admissions, is what the
        next call compares with."""
        if not self.enabled:
            return LiveGate(None, self.limit, False)
        running = list(running)
        holds = [h for h in retention.holds() if h.key in self._keys]   # held() saw them
        active = {program_of(r) for r in running}
        live = active | {self._keys[h.key] for h in holds}
        pressure = preemptions + sum(retention.stats.released[r] for r in PRESSURE_REASONS)
        if pressure > self._pressure:
            self.limit = max(1, len(live) // 2, min(len(live), self._fit(live, active)))
            self.lowered += 1
            self._ended = 0
        else:
            self._ended += len(self._live - live)
            if self._ended >= self.limit and self.limit < self.ceiling:
                self.limit += 1
                self._ended = 0
        self._pressure = pressure
        live -= self._shed(live, active, holds, retention)
        self._live = live
        return LiveGate(live, self.limit, not running, len(running), self.busy)

    def _fit(self, live: set[Hashable], active: set[Hashable]) -> int:
        """How many programs of projected length fit in the turns the live ones hold now."""
        ages = {p: self._turns.get(p, 0) + (p in active) for p in live}
        projected = sum(self._projected(ages[p], p in self._turns) for p in live)
        return int(len(live) * sum(ages.values()) // max(1, projected))

    def _projected(self, age: int, paused_before: bool) -> float:
        if not paused_before:
            return age                 # never paused: ends with the request it runs
        if self.length is None:
            return 2 * age
        return max(self.length, age + 1)

    def _shed(self, live: set[Hashable], active: set[Hashable], holds: list,
              retention: Retention) -> set[Hashable]:
        """Release ``holds`` of paused programs over the limit (module doc); the programs
        no longer live."""
        over = len(live) - self.limit
        if over <= 0:
            return set()
        keys_of: dict[Hashable, int] = {}            # program -> its holds not yet released
        for h in holds:
            keys_of[self._keys[h.key]] = keys_of.get(self._keys[h.key], 0) + 1
        paused = sorted((h for h in holds if self._keys[h.key] not in active),
                        key=lambda h: (h.rank, h.pages, -h.expected_back))
        shed: set[Hashable] = set()
        for h in paused:
            if len(shed) >= over:
                break
            p = self._keys[h.key]
            keys_of[p] -= 1
            if not keys_of[p]:
                shed.add(p)
            retention.release(h.key, "limit")
        return shed
