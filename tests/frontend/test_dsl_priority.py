"""``priority`` and ``agent`` in the DSL: run/run_batch options inherited by every call a
program makes (forks and nested programs included), the program name as the default label,
a default priority per backend, what reaches the engine / the server, and bad values."""

from __future__ import annotations

import pytest

import agentlang as al
from agentlang.backends.base import UnsupportedFeatureError
from agentlang.sampling import SamplingOptions


@al.function
def helper(s):
    s += "More: " + al.gen("more", max_tokens=3)


@al.function
def planner(s, topic):
    s += al.user("Plan " + topic)
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += f"{i}. " + al.gen("step", max_tokens=4)
    forks.join()
    s += al.assistant(al.gen("plan", max_tokens=5))
    helper(s)


def gens(m: al.Mock) -> list[SamplingOptions]:
    return [c.options for c in m.calls if c.kind in ("generate", "stream")]


def test_run_priority_and_label_reach_every_call_forks_included():
    m = al.Mock()
    planner.run(topic="x", backend=m, priority=7)
    opts = gens(m)
    assert len(opts) == 5                      # 3 fork branches, the plan, the nested helper
    assert {(o.priority, o.agent) for o in opts} == {(7, "planner")}
    m = al.Mock()
    planner.run(topic="x", backend=m, priority=-2, agent="ui.planner")
    assert {(o.priority, o.agent) for o in gens(m)} == {(-2, "ui.planner")}


def test_run_batch_inherits_and_defaults_to_no_priority():
    m = al.Mock()
    planner.run_batch([{"topic": "a"}, {"topic": "b"}], backend=m, agent="research")
    opts = gens(m)
    assert len(opts) == 10 and {(o.priority, o.agent) for o in opts} == {(None, "research")}
    m = al.Mock()
    planner.run_batch([{"topic": "a"}], backend=m, priority=3)
    assert {(o.priority, o.agent) for o in gens(m)} == {(3, "planner")}


def test_backend_default_priority_and_the_request_it_sends():
    ep = al.RuntimeEndpoint("http://127.0.0.1:9", priority=4)
    opts = SamplingOptions(max_tokens=2, agent="planner")
    body = ep.payload("hi", opts, False)
    assert body["priority"] == 4 and body["agent"] == "planner"
    body = ep.payload("hi", SamplingOptions(max_tokens=2, priority=-1), False)
    assert body["priority"] == -1 and "agent" not in body
    assert "priority" not in al.RuntimeEndpoint("http://127.0.0.1:9").payload(
        "hi", SamplingOptions(max_tokens=2), False)
    ep.close()


def test_program_name_label_is_sanitised():
    from agentlang.program import program_label
    from agentlang.runtime.core.agent_stats import check_label

    for name in ("planner", "<lambda>", "résumé", "x" * 100):
        assert check_label(program_label(name)) == program_label(name)


@pytest.mark.parametrize("kw,field", [
    ({"priority": "high"}, "priority"), ({"priority": 2 ** 31}, "priority"),
    ({"priority": 1.0}, "priority"), ({"agent": "two words"}, "agent"), ({"agent": ""}, "agent"),
])
def test_bad_priority_or_agent(kw, field):
    m = al.Mock()
    with pytest.raises(ValueError, match=rf"^{field}: "):
        planner.run(topic="x", backend=m, **kw)
    assert m.calls == []
    with pytest.raises(ValueError, match=rf"^{field}: "):
        planner.run_batch([{"topic": "x"}], backend=m, **kw)
    assert m.calls == []
    if "priority" in kw:
        with pytest.raises(ValueError, match=r"^priority: "):
            al.RuntimeEndpoint("http://127.0.0.1:9", priority=kw["priority"])


def test_openai_backend_refuses_priority():
    from agentlang.backends.openai import OpenAI

    backend = OpenAI("gpt-x", client=object())
    with pytest.raises(UnsupportedFeatureError, match="priority"):
        backend.check(SamplingOptions(max_tokens=1, priority=1))
    backend.check(SamplingOptions(max_tokens=1, agent="planner"))   # a label is local: fine
    with pytest.raises(UnsupportedFeatureError, match="priority"):
        backend.set_default_priority(1)
