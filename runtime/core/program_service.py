"""Program-level attained service: the tokens the engine has computed for each program so far
(the rule of Autellix's PLAS scheduler: among waiting requests of equal priority, the one whose
*program* has received the least service goes first, so short agent programs are not stuck
behind the many calls of long ones; a program's calls share one account).

A request's program is its session (every DSL run is one: ``run-<id>``; SGLang's and the OpenAI
routes' ``session_id``), else its ``agent`` accounting label, else the request itself. Service is
counted in tokens run (prefill chunks and decodes alike), charged when a step schedules them.

Bounded: at most ``cap`` programs are remembered (:data:`MAX_PROGRAMS`), the least recently
charged forgotten first — a forgotten program starts again from zero, as a new one would.

The ``continue`` policy reads the same accounts the other way round: the program that has
received the *most* service goes first, so programs under way finish before new ones start
(for programs of equal length that is shortest-remaining-first: the mean completion time
falls, and fewer histories are live at once). ``live`` is ``continue`` plus a limit on the
programs whose KV is in the pool at once, learnt from memory pressure
(``agentlang.runtime.scheduler.live_programs``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

MAX_PROGRAMS = 4096
# longest cached prefix first | least-served program first | most-served program first |
# most-served first and at most as many live programs as fit (scheduler.live_programs)
SCHEDULE_POLICIES = ("lpm", "program", "continue", "live")
PROGRAM_ORDER = {"lpm": 0, "program": 1, "continue": -1, "live": -1}   # PriorityPolicy


def check_schedule_policy(value: Any) -> str:
    if value not in SCHEDULE_POLICIES:
        raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}, "
                         f"got {value!r}")
    return value


def program_of(req: Any) -> Hashable:
    """The account ``req``'s service goes to (module doc)."""
    g = req.group
    if g.session is not None:
        return ("session", g.session)
    if g.params.agent is not None:
        return ("agent", g.namespace, g.params.agent)
    return ("request", g.rid)


def single_call(req: Any) -> bool:
    """``req`` is its own program (no session, no agent label): it ends with its request."""
    return req.group.session is None and req.group.params.agent is None


class ProgramService:
    """Tokens run per program, bounded (module doc)."""

    def __init__(self, cap: int = MAX_PROGRAMS):
        self.cap = cap
        self.tokens: OrderedDict[Hashable, int] = OrderedDict()

    def attained(self, req: Any) -> int:
        return self.tokens.get(program_of(req), 0)

    def charge(self, req: Any, n: int) -> None:
        key = program_of(req)
        self.tokens[key] = self.tokens.get(key, 0) + n
        self.tokens.move_to_end(key)
        while len(self.tokens) > self.cap:
            self.tokens.popitem(last=False)
