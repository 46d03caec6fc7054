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


def _fake_server(model_path, calls: list, answer):
    """A transport for ``RuntimeEndpoint``: records ``(path, body)`` in ``calls``, answers
    ``/get_model_info`` with ``model_path`` and every other request with ``answer(path, body)``."""
    import json

    import httpx

    def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        calls.append((request.url.path, body))
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"model_path": str(model_path),
                                             "tokenizer_path": str(model_path)})
        return answer(request.url.path, body)
    return httpx.MockTransport(server)


def test_endpoint_runs_without_a_session_when_the_server_is_at_its_limit(model_path):
    import httpx

    calls = []

    def answer(path: str, body: dict) -> httpx.Response:
        if path == "/close_session":
            return httpx.Response(404, json={"error": {"message": "no open session"}})
        if "session_id" in body:
            return httpx.Response(429, json={"error": {"message": "1024 sessions are open"}})
        return httpx.Response(200, json={"text": "fine", "output_ids": [1],
                                         "meta_info": {"finish_reason": {"type": "stop"}}})

    backend = al.RuntimeEndpoint("http://fake", transport=_fake_server(model_path, calls, answer))

    @al.function
    def prog(s):
        s += "Hello " + al.gen("x", max_tokens=4)

    st = prog.run(backend=backend)
    assert st["x"] == "fine"
    gens = [b for p, b in calls if p == "/generate"]
    assert [("session_id" in b) for b in gens] == [True, False]    # refused, then retried
    assert calls[-1][0] == "/close_session"                          # best effort, no error


def test_a_tools_expected_duration_reaches_the_runs_hold(runtime):
    """Before a tool runs, the DSL tells the backend when the run will generate again
    (the tool's declared ``expected_s``, else its mean so far): the run's hold is expected back
    then, which orders releases under pressure. When the run ends its history is demoted."""
    import time

    engine = runtime.engine
    seen = []

    @al.tool(expected_s=42.0)
    def search(query: str) -> str:
        """Search the web."""
        now = time.monotonic()
        seen.append([h.expected_back - now for h in engine.scheduler.retention.holds()])
        return "two routes"

    @al.tool
    def read(url: str) -> str:
        """Read a page."""
        time.sleep(0.3)
        now = time.monotonic()
        seen.append([h.expected_back - now for h in engine.scheduler.retention.holds()])
        return "a page"

    @al.function
    def agent(s, tool):
        s += al.system(HISTORY)
        s += al.user("Plan a trip.")
        s += al.assistant(al.tool_call(tool, name="r", max_tokens=40, temperature=0))
        s += al.user("Result: " + al.gen("next", max_tokens=32, temperature=0, ignore_eos=True))

    demoted = engine.metrics()["session_demoted_pages"]
    agent.run(tool=search, backend=runtime)
    assert len(seen) == 1 and seen[0] and seen[0][0] == pytest.approx(42.0, abs=5.0)
    assert engine.metrics()["session_demoted_pages"] > demoted       # the run ended
    seen.clear()
    agent.run(tool=read, backend=runtime)          # first run: no duration known, no hint
    agent.run(tool=read, backend=runtime)          # second: its measured ~0.3 s
    assert read.expected_duration() == pytest.approx(0.3, abs=0.2)
    assert seen[1] and -0.5 < seen[1][0] < 0.5, seen
    assert not (-0.5 < seen[0][0] < 0.5), seen     # the default (ttl / 2) before any run
    engine.flush_cache()
    engine.cache.check_integrity()


def _one_tool_call(expected_s: float):
    """A program of one turn that calls ``ping``, a tool expected to take ``expected_s``."""
    @al.tool(expected_s=expected_s)
    def ping(host: str) -> str:
        """Ping a host."""
        return "pong"

    @al.function
    def prog(s):
        s += al.user("go")
        s += al.assistant(al.tool_call(ping, name="r"))
    return prog


def test_hints_reach_the_backend_and_bad_durations_are_refused():
    calls = []

    class Recording(al.Mock):
        def next_use(self, run_id, seconds):
            calls.append((run_id, seconds))

    _one_tool_call(3.0).run(backend=Recording())
    assert [c[1] for c in calls] == [3.0] and calls[0][0]
    with pytest.raises(ValueError, match=r"expected_s: must be in \[0, 86400\]"):
        al.tool(expected_s=-1)(lambda x: x)


def test_the_endpoint_sends_hints_to_servers_that_take_them(model_path):
    """``RuntimeEndpoint.next_use``: ``/session_hint`` for the run's session; a server without
    the route (SGLang's 404 ``Not Found``) is not asked again; nothing raises."""
    import httpx

    prog = _one_tool_call(2.0)

    for has_route in (True, False):
        calls = []

        def answer(path: str, body: dict, has_route=has_route) -> httpx.Response:
            if path == "/session_hint":
                if not has_route:
                    return httpx.Response(404, json={"detail": "Not Found"})
                return httpx.Response(200, json={"session_id": body["session_id"],
                                                 "held_pages": 3})
            if path == "/close_session":
                return httpx.Response(200)
            return httpx.Response(200, json={
                "text": '{"name": "ping", "arguments": {"host": "a"}}', "output_ids": [1],
                "meta_info": {"finish_reason": {"type": "stop"}}})

        backend = al.RuntimeEndpoint("http://fake", transport=_fake_server(model_path, calls, answer))
        for _ in range(2):
            prog.run(backend=backend)
        hints = [b for p, b in calls if p == "/session_hint"]
        sessions = {b["session_id"] for p, b in calls if p == "/generate"}
        assert len(hints) == (2 if has_route else 1), calls
        assert all(h["next_use_s"] == 2.0 and h["session_id"] in sessions for h in hints)
