"""The priority policy alone (runtime/core/priority.py) and per-label accounting
(runtime/core/agent_stats.py), on small stand-in requests: ordering, direction, aging bound,
victim choice, make_room, label bounds and validation."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agentlang.runtime.core.agent_stats import OTHER, UNLABELED, AgentStats, check_label
from agentlang.runtime.core.priority import PRIORITY_MAX, PRIORITY_MIN, PriorityPolicy, check_priority


@dataclass(eq=False)
class Req:
    name: str
    priority: int = 0
    wait_steps: int = 0
    admit_seq: int = 0
    pages: int = 1
    num_uncomputed: int = 1       # 1: decoding; more: a prefill chunk left


def order(policy: PriorityPolicy, reqs: list[Req], cached: dict[str, int] | None = None):
    cached = cached or {}
    return [r.name for r in sorted(reqs, key=lambda r: policy.admission_key(
        r, cached.get(r.name, 0)))]


def test_higher_priority_first_then_cached_prefix_then_fifo():
    p = PriorityPolicy()
    reqs = [Req("a", 0), Req("b", 5), Req("c", 0), Req("d", 5), Req("e", -3)]
    assert order(p, reqs) == ["b", "d", "a", "c", "e"]
    assert order(p, reqs, {"c": 32, "d": 16}) == ["d", "b", "c", "a", "e"]


def test_among_equals_the_shortest_prefill_goes_first_then_fifo():
    """Rule (4): equal priority, service and cached prefix: fewer tokens left to compute
    first (what is cached does not count), equal ones in arrival order; rules (1) and (3)
    still come before it."""
    p = PriorityPolicy()
    reqs = [Req("long", num_uncomputed=500), Req("short", num_uncomputed=60),
            Req("mid", num_uncomputed=200), Req("mid2", num_uncomputed=200)]
    assert order(p, reqs) == ["short", "mid", "mid2", "long"]
    # "long" has 480 of its 500 cached: 20 left, and the longer cached prefix wins anyway
    assert order(p, reqs, {"long": 480}) == ["long", "short", "mid", "mid2"]
    reqs.append(Req("urgent", priority=1, num_uncomputed=4000))
    assert order(p, reqs)[0] == "urgent"


def test_low_values_first_reverses_direction_only():
    p = PriorityPolicy(low_values_first=True)
    reqs = [Req("a", 0), Req("b", 5), Req("c", -3), Req("d", 0)]
    assert order(p, reqs) == ["c", "a", "d", "b"]


def test_aging_subsumes_the_old_wait_jump():
    """Equal priorities: a request that waited age_steps goes ahead of fresh ones with a
    longer cached prefix (the old max_wait_steps rule)."""
    p = PriorityPolicy(age_steps=64)
    old, fresh = Req("old", wait_steps=63), Req("fresh")
    assert order(p, [fresh, old], {"fresh": 100}) == ["fresh", "old"]
    old.wait_steps = 64
    assert order(p, [fresh, old], {"fresh": 100}) == ["old", "fresh"]


@pytest.mark.parametrize("gap", [0, 1, 7, 50])
def test_aging_bound_against_a_stream_of_higher_arrivals(gap):
    """Simulate one admission per step against a fresh higher-priority arrival every step:
    the low request is admitted after at most (gap + 1) * age_steps waiting steps."""
    age = 8
    p = PriorityPolicy(age_steps=age)
    low = Req("low", priority=0)
    queue: list[Req] = [low]
    for step in range(10_000):
        queue.append(Req(f"hi{step}", priority=gap))
        for r in queue:
            r.wait_steps += 1
        first = min(queue, key=lambda r: p.admission_key(r, 0))
        queue.remove(first)
        if first is low:
            break
    assert low.wait_steps <= (gap + 1) * age
    assert low.wait_steps >= gap * age     # ties (FIFO) win from gap * age: the bound is tight


def test_victim_lowest_effective_then_newest():
    p = PriorityPolicy(age_steps=10)
    running = [Req("a", 0, admit_seq=1), Req("b", 0, admit_seq=2), Req("c", 3, admit_seq=3),
               Req("d", 0, wait_steps=10, admit_seq=4)]
    assert p.victim(running).name == "b"
    assert p.victim(running, below=0) is None
    assert p.victim(running, below=1).name == "b"
    running[1].priority = 9
    assert p.victim(running, below=1).name == "a"


class Room:
    def __init__(self, running: list[Req]):
        self.running = running
        self.preempted: list[str] = []

    def pages_needed(self, req: Req) -> int:
        return req.pages

    def pages_held(self, req: Req) -> int:
        return req.pages

    def preempt(self, req: Req) -> None:
        self.running.remove(req)
        self.preempted.append(req.name)


def test_make_room_preempts_only_strictly_lower_for_slots_and_pages():
    p = PriorityPolicy()
    running = [Req("bg1", 0, admit_seq=1, pages=4), Req("bg2", 0, admit_seq=2, pages=4),
               Req("mid", 5, admit_seq=3, pages=4)]
    room = Room(running)
    # batch full (0 slots): two high-priority arrivals take the two newest low ones' slots
    n = p.make_room([Req("hi1", 9), Req("hi2", 9), Req("eq", 0)], running, 0, 100, room)
    assert n == 2 and room.preempted == ["bg2", "bg1"]
    # slots free but pages short: the page need decides
    running = [Req("bg", 0, admit_seq=1, pages=6), Req("mid", 5, admit_seq=2, pages=6)]
    room = Room(running)
    assert p.make_room([Req("hi", 9, pages=5)], running, 3, 2, room) == 1
    assert room.preempted == ["bg"]
    # nothing lower to take: nobody preempted, equal priority never preempts
    room = Room([Req("x", 9, admit_seq=1)])
    assert p.make_room([Req("y", 9)], room.running, 0, 100, room) == 0
    # aging orders the queue but never makes a waiting request preempt: an aged low request
    # does not evict a fresh running one of its own priority, nor an aged running one a
    # fresh arrival above its base priority
    room = Room([Req("run", 0, admit_seq=1)])
    assert p.make_room([Req("aged", 0, wait_steps=640)], room.running, 0, 100, room) == 0
    room = Room([Req("aged_run", 0, wait_steps=200, admit_seq=1)])      # effective 3
    assert p.make_room([Req("hi", 2)], room.running, 0, 100, room) == 0
    assert p.make_room([Req("hi", 4)], room.running, 0, 100, room) == 1


def test_priority_validation_names_the_field_and_range():
    assert check_priority(PRIORITY_MAX) == PRIORITY_MAX
    assert check_priority(PRIORITY_MIN) == PRIORITY_MIN
    for bad in ("1", 1.0, True, None, PRIORITY_MAX + 1, PRIORITY_MIN - 1):
        with pytest.raises(ValueError, match=r"^priority: .*-2147483648"):
            check_priority(bad)
    with pytest.raises(ValueError, match="age_steps"):
        PriorityPolicy(age_steps=0)


def test_labels_bounded_with_overflow_into_other():
    s = AgentStats(max_labels=2)
    s.record("planner", 10, 5, 4, 0.5)
    s.record("researcher", 20, 6, 0, 1.0)
    s.record("third", 30, 7, 1, 2.0)
    s.record("fourth", 40, 8, 2, 3.0)
    s.record(None, 1, 1, 0, 0.0)
    s.record("planner", 10, 5, 10, 0.25)
    snap = s.snapshot()
    assert set(snap) == {"planner", "researcher", OTHER, UNLABELED}
    assert snap["planner"] == {"requests": 2, "prompt_tokens": 20, "generated_tokens": 10,
                               "cached_tokens": 14, "queue_s": 0.75}
    assert snap[OTHER]["requests"] == 2 and snap[OTHER]["prompt_tokens"] == 70
    assert snap[UNLABELED]["requests"] == 1


def test_label_validation():
    assert check_label(None) is None
    assert check_label("agent-1.planner:v2/x_y") == "agent-1.planner:v2/x_y"
    for bad in ("", "x" * 65, "has space", "é", 3, ["a"]):
        with pytest.raises(ValueError, match=r"^agent: "):
            check_label(bad)


def test_urgent_rank_only_for_a_prefill_that_outranks_someone():
    p = PriorityPolicy(age_steps=4)
    dec_hi, dec_lo = Req("dh", priority=5), Req("dl", priority=0)
    pre_hi, pre_lo = Req("ph", priority=5, num_uncomputed=9), Req("pl", num_uncomputed=9)
    assert p.urgent_rank([], [dec_hi, dec_lo]) is None            # only decodes
    assert p.urgent_rank([], [pre_lo, dec_hi]) is None            # the prefill is the lowest
    assert p.urgent_rank([Req("w", priority=5)], [dec_hi]) is None    # equal priorities
    assert p.urgent_rank([Req("w", priority=5)], [dec_lo]) == 5   # a waiting request needs one
    assert p.urgent_rank([], [pre_hi, dec_lo]) == 5               # a running prefill chunk left
    mid = Req("m", priority=3)
    assert p.urgent_rank([mid], [dec_hi, dec_lo]) == 3            # the highest *needing* one
    # aging lifts a lower request to the top rank: it is not "below", nothing is urgent
    assert p.urgent_rank([Req("w", priority=5)], [Req("aged", wait_steps=20)]) is None
    # equal priorities with aged waiters (the no-priority workload): never urgent
    assert p.urgent_rank([Req("a", wait_steps=9), Req("b")], [Req("c")]) is None


def test_urgent_rank_follows_the_direction():
    p = PriorityPolicy(low_values_first=True)
    assert p.urgent_rank([Req("w", priority=-3)], [Req("r", priority=0)]) == 3
    assert p.urgent_rank([Req("w", priority=3)], [Req("r", priority=0)]) is None
