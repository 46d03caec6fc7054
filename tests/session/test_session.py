"""Sessions without a model: SGLang's turn rules (continue, offset, replace,
drop_previous_output, BOS), refusals that change nothing, limits, namespaces and timeouts."""

import pytest

from agentlang.runtime.session.registry import SessionRegistry
from agentlang.runtime.session.session import SessionError, TurnParams

BOS = 1


def open_one(capacity=1000, timeout=None, max_sessions=8):
    reg = SessionRegistry(max_context=2048, max_sessions=max_sessions, default_timeout=None)
    return reg, reg.open("ns", "s", capacity, timeout)


def turn(s, rid, ids, parent=None, output=(), **kw):
    prompt, removed = s.assemble(TurnParams("s", parent, **kw), ids, 4, rid, BOS)
    s.finish(rid, list(output), now=0.0)
    return prompt, removed


def test_continue_appends_the_parents_prompt_and_output_and_drops_a_bos():
    _, s = open_one()
    p0, _ = turn(s, "t0", [BOS, 5, 6], output=[7, 8])
    assert p0 == [BOS, 5, 6]
    p1, _ = turn(s, "t1", [BOS, 9], parent="t0", output=[10])
    assert p1 == [BOS, 5, 6, 7, 8, 9]
    p2, _ = turn(s, "t2", [11], parent="t1", drop_previous_output=True)
    assert p2 == [BOS, 5, 6, 7, 8, 9, 11]           # t1's output [10] left out


def test_offset_cuts_the_history():
    _, s = open_one()
    turn(s, "t0", [2, 3, 4], output=[5, 6])
    p, _ = turn(s, "t1", [9], parent="t0", offset=2)
    assert p == [2, 3, 9]
    with pytest.raises(SessionError, match=r"session_params.offset: must be in \[0, 5\]"):
        s.assemble(TurnParams("s", "t0", offset=6), [9], 4, "t2", BOS)
    with pytest.raises(SessionError, match="needs session_params.rid"):
        s.assemble(TurnParams("s", None, offset=1), [9], 4, "t2", BOS)
    assert "t2" not in s.turns


def test_replace_removes_the_branch_below_and_reports_running_turns():
    _, s = open_one()
    turn(s, "t0", [2], output=[3])
    turn(s, "a", [4], parent="t0", output=[5])
    turn(s, "a2", [6], parent="a", output=[7])
    s.assemble(TurnParams("s", "a2"), [8], 4, "running", BOS)     # not finished
    _, removed = turn(s, "b", [9], parent="t0", replace=True)
    assert removed == ["running"]
    assert sorted(s.turns) == ["b", "t0"]
    _, removed = turn(s, "c", [1], replace=True)                   # no rid: everything
    assert removed == [] and sorted(s.turns) == ["c"]


def test_refusals_change_nothing():
    _, s = open_one(capacity=10)
    turn(s, "t0", [2, 3], output=[4])
    s.assemble(TurnParams("s", "t0"), [5], 4, "live", BOS)
    before = dict(s.turns)
    cases = [
        (TurnParams("s", "nope"), [1], "t9", "session_params.rid: no turn 'nope'"),
        (TurnParams("s", "live"), [1], "t9", "has not finished"),
        (TurnParams("s", "t0"), [1], "t0", "already a turn"),
        (TurnParams("s", "t0"), [1] * 10, "t9", "over the session's capacity of 10"),
        (TurnParams("s", None), [], "t9", "needs input tokens"),
    ]
    for tp, ids, rid, msg in cases:
        with pytest.raises(SessionError, match=msg):
            s.assemble(tp, ids, 4, rid, BOS)
    assert s.turns == before


def test_capacity_error_is_413_and_other_errors_400():
    _, s = open_one(capacity=5)
    with pytest.raises(SessionError) as e:
        s.assemble(TurnParams("s"), [1, 2], 4, "t", BOS)
    assert e.value.status == 413 and e.value.field == "session_params.id"


def test_registry_limits_namespaces_and_bad_values():
    reg = SessionRegistry(max_context=100, max_sessions=2, default_timeout=None)
    reg.open("tenant-a", "x")
    with pytest.raises(SessionError, match="already open"):
        reg.open("tenant-a", "x")
    reg.open("tenant-b", "x")                          # same id, other namespace: another one
    with pytest.raises(SessionError) as e:
        reg.open("tenant-c", "y")
    assert e.value.status == 429
    with pytest.raises(SessionError) as e:
        reg.get("tenant-c", "x")
    assert e.value.status == 404 and e.value.field == "session_params.id"
    assert reg.close("tenant-a", "x") is not None and reg.close("tenant-a", "x") is None
    for kw, field in (({"capacity": 0}, "capacity_of_str_len"),
                      ({"capacity": 101}, "capacity_of_str_len"),
                      ({"timeout": -1}, "timeout"), ({"timeout": float("nan")}, "timeout"),
                      ({"session_id": ""}, "session_id"),
                      ({"session_id": "x" * 257}, "session_id")):
        with pytest.raises(SessionError) as e:
            reg.open("tenant-a", **({"session_id": "z"} | kw))
        assert e.value.field == field
    assert len(reg) == 1


def test_join_opens_on_first_use_and_checks_capacity():
    reg = SessionRegistry(max_context=100, max_sessions=4, default_timeout=None)
    assert reg.join("ns", "conv", 10, 5) == "conv"
    assert reg.find("ns", "conv") is not None and reg.find("other", "conv") is None
    with pytest.raises(SessionError) as e:
        reg.join("ns", "conv", 90, 20)
    assert e.value.status == 413 and e.value.field == "session"


def test_idle_sessions_are_reaped():
    reg, s = open_one(timeout=5.0)
    s.last_active = 100.0
    assert reg.reap(104.0) == []
    assert reg.reap(105.5) == [s] and len(reg) == 0
