"""Every program run is a session of the in-process engine: while the program's own Python
runs between generations (a tool), the run's history is held in the cache; when the run ends
the session closes and the hold is released. Outputs do not change."""

import pytest

import agentlang as al

pytestmark = pytest.mark.slow

HISTORY = ("You are a planning agent. Tools: search(query) and read(url). Plan, then call one "
           "tool per turn. ") * 10


@pytest.fixture(scope="module")
def runtime():
    backend = al.Runtime(kv_budget_mb=64, weights="dense")
    yield backend
    backend.close()


def test_a_run_is_a_session_held_during_its_tool_and_closed_at_its_end(runtime):
    engine = runtime.engine
    seen = {}

    @al.function
    def agent(s):
        s += HISTORY + "Task: plan a trip.\nAction:"
        s += al.gen("act", max_tokens=6, temperature=0)
        _ = s["act"]                                   # the tool runs after the call is known
        m = engine.metrics()
        seen["holds"] = m["session_holds"]
        seen["rows"] = [r for r in engine.sessions.rows() if r.held_pages > 0]
        s += "\nObservation: two routes.\nAction:"
        s += al.gen("act2", max_tokens=6, temperature=0)

    before = engine.metrics()
    st = agent.run(backend=runtime)
    after = engine.metrics()
    assert seen["holds"] == before["session_holds"] + 1
    (row,) = seen["rows"]
    assert row.id.startswith("run-") and row.held_pages >= 10
    assert after["sessions_open"] == before["sessions_open"]          # closed at the end
    assert after["session_holds"] == before["session_holds"]
    assert after["session_releases_continued"] > before["session_releases_continued"]
    assert after["session_releases_closed"] > before["session_releases_closed"]
    # the same program as plain requests: identical text
    first = engine.generate(HISTORY + "Task: plan a trip.\nAction:",
                            al_params(max_tokens=6))
    assert st["act"] == first.outputs[0].text
    engine.flush_cache()
    engine.cache.check_integrity()


def al_params(**kw):
    from agentlang.runtime import SamplingParams

    return SamplingParams(temperature=0, **kw)


def test_endpoint_runs_without_a_session_when_the_server_is_at_its_limit(model_path):
    import json

    import httpx

    calls = []

    def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        calls.append((request.url.path, body))
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"model_path": str(model_path),
                                             "tokenizer_path": str(model_path)})
        if request.url.path == "/close_session":
            return httpx.Response(404, json={"error": {"message": "no open session"}})
        if "session_id" in body:
            return httpx.Response(429, json={"error": {"message": "1024 sessions are open"}})
        return httpx.Response(200, json={"text": "fine", "output_ids": [1],
                                         "meta_info": {"finish_reason": {"type": "stop"}}})

    backend = al.RuntimeEndpoint("http://fake", transport=httpx.MockTransport(server))

    @al.function
    def prog(s):
        s += "Hello " + al.gen("x", max_tokens=4)

    st = prog.run(backend=backend)
    assert st["x"] == "fine"
    gens = [b for p, b in calls if p == "/generate"]
    assert [("session_id" in b) for b in gens] == [True, False]    # refused, then retried
    assert calls[-1][0] == "/close_session"                          # best effort, no error
