"""The ``program`` schedule policy (Autellix's PLAS rule) on the model-free step harness:
among waiting requests of equal priority, the one whose program (session, else agent label,
else itself) has had the least service goes first; priority still comes first; the default
``lpm`` policy keeps arrival order for requests without a cached prefix; outputs unchanged."""

from __future__ import annotations

import pytest

from agentlang.runtime import Engine
from agentlang.runtime.core.program_service import ProgramService, program_of
from tests.support.step_harness import StepHarness, expected_tokens

PS = 4


def prompt(k: int, n: int = 12) -> list[int]:
    return [(k * 7) % 50 + 1] + [(k + i) % 50 + 1 for i in range(1, n)]


def second_turns(policy: str, b_priority: int = 0):
    """Agent a's first call runs alone (max_running 1); meanwhile a's second call and then
    agent b's first call arrive. Which of the two is admitted first?"""
    h = StepHarness(page_size=PS, max_running=1, schedule_policy=policy)
    a1 = h.submit(prompt(1), max_tokens=20, ignore_eos=True, agent="a")
    h.step()
    a2 = h.submit(prompt(2), max_tokens=4, ignore_eos=True, agent="a")
    b1 = h.submit(prompt(3), max_tokens=4, ignore_eos=True, agent="b", priority=b_priority)
    h.run()
    for g, k, n in ((a1, 1, 20), (a2, 2, 4), (b1, 3, 4)):
        assert g.children[0].output_ids == expected_tokens(prompt(k), n)
    h.assert_no_leak()
    return "b first" if b1.admit_time < a2.admit_time else "a first"


def test_least_served_program_first():
    assert second_turns("program") == "b first"
    assert second_turns("lpm") == "a first"          # arrival order, as before


def test_continue_puts_programs_under_way_first():
    """``continue``: a served program's next call goes before a new program's first one,
    even one that arrived earlier (lpm and program: arrival / least served: the new one)."""
    def order(policy):
        h = StepHarness(page_size=PS, max_running=1, schedule_policy=policy)
        a1 = h.submit(prompt(1), max_tokens=20, ignore_eos=True, agent="a")
        h.step()
        b1 = h.submit(prompt(3), max_tokens=4, ignore_eos=True, agent="b")
        a2 = h.submit(prompt(2), max_tokens=4, ignore_eos=True, agent="a")
        h.run()
        for g, k, n in ((a1, 1, 20), (a2, 2, 4), (b1, 3, 4)):
            assert g.children[0].output_ids == expected_tokens(prompt(k), n)
        h.assert_no_leak()
        return "a first" if a2.admit_time < b1.admit_time else "b first"

    assert order("continue") == "a first"
    assert order("lpm") == order("program") == "b first"


def test_priority_comes_before_service():
    assert second_turns("program", b_priority=-1) == "a first"


def test_program_keys_and_the_bound():
    class G:
        def __init__(self, session=None, agent=None, rid="r"):
            self.session, self.rid, self.namespace = session, rid, ("ns",)
            self.params = type("P", (), {"agent": agent})()

    class R:
        def __init__(self, **kw):
            self.group = G(**kw)

    assert program_of(R(session=("ns", "run-1"), agent="x")) == ("session", ("ns", "run-1"))
    assert program_of(R(agent="x")) == ("agent", ("ns",), "x")
    assert program_of(R(rid="q")) == ("request", "q")
    s = ProgramService(cap=2)
    for rid in "abc":
        s.charge(R(rid=rid), 5)
    assert s.attained(R(rid="a")) == 0 and s.attained(R(rid="c")) == 5   # "a" forgotten


def test_bad_policy_is_named():
    with pytest.raises(ValueError,
                       match="schedule_policy must be one of lpm, program, continue, live"):
        Engine(schedule_policy="fifo")
