"""``priority`` and ``agent`` over HTTP: accepted on /generate (top level, as SGLang) and on the
OpenAI routes (extra fields, official client's ``extra_body``); bad values are 400s naming the
field with nothing queued; per-agent totals on /metrics; a low-priority-first server."""

from __future__ import annotations

import pytest
from server_harness import metrics, wait_idle

pytestmark = pytest.mark.slow


def agent_series(m: dict[str, float], agent: str) -> dict[str, float]:
    tail = str([("agent", agent)])
    return {k[: -len(tail)]: v for k, v in m.items() if k.endswith(tail)}


def test_priority_and_agent_accepted_and_counted(http, client):
    before = agent_series(metrics(http), "planner")
    r = http.post("/generate", json={"text": "Hello", "priority": 7, "agent": "planner",
                                     "sampling_params": {"max_new_tokens": 3, "temperature": 0,
                                                         "ignore_eos": True}})
    assert r.status_code == 200, r.text
    out = r.json()
    chat = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        temperature=0, extra_body={"priority": -3, "agent": "planner", "ignore_eos": True})
    assert chat.usage.completion_tokens == 2
    cmpl = client.completions.create(model="default", prompt="Once", max_tokens=2,
                                      extra_body={"priority": 1, "agent": "planner",
                                                  "ignore_eos": True})
    assert cmpl.usage.completion_tokens == 2
    after = agent_series(metrics(http), "planner")
    base = {k: before.get(k, 0.0) for k in after}
    assert after["agentlang_agent_requests_total"] - base["agentlang_agent_requests_total"] == 3
    assert after["agentlang_agent_generation_tokens_total"] - \
        base["agentlang_agent_generation_tokens_total"] == 7
    assert after["agentlang_agent_prompt_tokens_total"] - \
        base["agentlang_agent_prompt_tokens_total"] == out["meta_info"]["prompt_tokens"] + \
        chat.usage.prompt_tokens + cmpl.usage.prompt_tokens
    assert after["agentlang_agent_queue_seconds_total"] >= base[
        "agentlang_agent_queue_seconds_total"]
    assert "agentlang_agent_cached_tokens_total" in after


@pytest.mark.parametrize("path,body,param", [
    ("/generate", {"text": "x", "priority": "5"}, "priority"),
    ("/generate", {"text": "x", "priority": 1.5}, "priority"),
    ("/generate", {"text": "x", "priority": 2 ** 31}, "priority"),
    ("/generate", {"text": "x", "priority": -(2 ** 31) - 1}, "priority"),
    ("/generate", {"text": "x", "agent": "a" * 65}, "agent"),
    ("/generate", {"text": "x", "agent": "has space"}, "agent"),
    ("/generate", {"text": "x", "agent": 12}, "agent"),
    ("/generate", {"text": "x", "priority": 1, "sampling_params": {"priority": 2}},
     "sampling_params.priority"),     # not a sampling parameter in SGLang either
    ("/v1/completions", {"model": "default", "prompt": "x", "priority": True}, "priority"),
    ("/v1/completions", {"model": "default", "prompt": "x", "priority": 2 ** 40}, "priority"),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "x"}],
                              "agent": ""}, "agent"),
])
def test_bad_priority_or_agent_is_400_and_nothing_queued(http, path, body, param):
    before = wait_idle(http)
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert param in err["message"]
    after = metrics(http)
    assert after["agentlang_prompt_tokens_total"] == before["agentlang_prompt_tokens_total"]
    assert after["agentlang_num_requests_waiting"] == 0


def test_low_priority_values_first_flag_reaches_the_engine_config():
    import argparse

    from agentlang.runtime.server.cli import add_serve_arguments, engine_kwargs

    p = add_serve_arguments(argparse.ArgumentParser())
    assert engine_kwargs(p.parse_args([])) == {}
    on = engine_kwargs(p.parse_args(["--schedule-low-priority-values-first",
                                     "--max-wait-steps", "8"]))
    assert on == {"schedule_low_priority_values_first": True, "max_wait_steps": 8}
