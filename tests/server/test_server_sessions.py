"""SGLang's sessions over HTTP on the real server: /open_session, turns through
``session_params`` (continue, offset, replace), /close_session; ``session_id`` on the OpenAI
routes (body field and X-Session-ID header) keeping an agent's KV; per-session /metrics; bad
ids and values answered with the field named and nothing left held."""

from __future__ import annotations

import pytest
from server_harness import metrics, pages_after_flush, wait_idle

pytestmark = pytest.mark.slow

SYSTEM = ("You are a research agent. Tools: search(query) returns snippets; read(url) returns "
          "a page. Think, then call one tool per turn. ") * 8


def gen(http, text=None, input_ids=None, n=8, **extra):
    body = {"sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
            **extra}
    body["text" if text is not None else "input_ids"] = text if text is not None else input_ids
    return http.post("/generate", json=body)


def tokenize(http, text):
    return http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]


def test_turns_continue_branch_and_close(http):
    baseline = pages_after_flush(http)
    r = http.post("/open_session", json={"capacity_of_str_len": 4000})
    assert r.status_code == 200
    sid = r.json()
    assert isinstance(sid, str) and sid
    t0 = gen(http, SYSTEM + "Task: find the tallest lighthouse.", rid="t0",
             session_params={"id": sid})
    assert t0.status_code == 200, t0.text
    t0 = t0.json()
    t1 = gen(http, " Observation: 3 results.", rid="t1",
             session_params={"id": sid, "rid": "t0"}).json()
    prompt0 = t0["meta_info"]["prompt_tokens"]
    assert t1["meta_info"]["prompt_tokens"] == prompt0 + 8 + len(
        tokenize(http, " Observation: 3 results."))
    assert t1["meta_info"]["cached_tokens"] >= prompt0 // 16 * 16
    # the same continuation sent in full without the session gives the same tokens
    full = gen(http, input_ids=tokenize(http, SYSTEM + "Task: find the tallest lighthouse.")
               + t0["output_ids"] + tokenize(http, " Observation: 3 results.")).json()
    assert full["output_ids"] == t1["output_ids"]
    # a branch from t0 cut back to its prompt, replacing t1
    t2 = gen(http, " Instead, read the first page.", rid="t2",
             session_params={"id": sid, "rid": "t0", "offset": prompt0, "replace": True})
    assert t2.status_code == 200 and t2.json()["meta_info"]["prompt_tokens"] == prompt0 + len(
        tokenize(http, " Instead, read the first page."))
    gone = gen(http, "x", rid="t3", session_params={"id": sid, "rid": "t1"})
    assert gone.status_code == 400 and gone.json()["error"]["param"] == "session_params.rid"
    m = metrics(http)
    assert m["agentlang_sessions_open"] >= 1
    assert m[f"agentlang_session_held_pages_by_session[('session', '{sid}')]"] > 0
    assert http.post("/close_session", json={"session_id": sid}).status_code == 200
    wait_idle(http)
    assert f"agentlang_session_held_pages_by_session[('session', '{sid}')]" not in metrics(http)
    assert pages_after_flush(http) == baseline


def test_session_id_on_openai_routes_keeps_the_agents_kv(client, http):
    before = metrics(http)["agentlang_session_holds"]
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Find the tallest lighthouse."}]
    first = client.chat.completions.create(model="default", messages=messages, max_tokens=8,
                                           temperature=0, extra_body={"session_id": "agent-7"})
    assert metrics(http)["agentlang_session_holds"] == before + 1
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Observation: 3 results."}]
    second = client.chat.completions.create(
        model="default", messages=messages, max_tokens=8, temperature=0,
        extra_headers={"X-Session-ID": "agent-7"})
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens // 2
    m = metrics(http)
    assert m["agentlang_session_hold_releases_total[('reason', 'continued')]"] >= 1
    r = http.post("/v1/completions", json={"model": "default", "prompt": "hi", "max_tokens": 2,
                                           "session_id": "a"}, headers={"X-Session-ID": "b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"
    for sid in ("agent-7", "a"):
        http.post("/close_session", json={"session_id": sid})


@pytest.mark.parametrize("path,body,status,param", [
    ("/open_session", {}, 400, "capacity_of_str_len"),
    ("/open_session", {"capacity_of_str_len": 0}, 400, "capacity_of_str_len"),
    ("/open_session", {"capacity_of_str_len": 10**9}, 400, "capacity_of_str_len"),
    ("/open_session", {"capacity_of_str_len": 100, "timeout": -1}, 400, "timeout"),
    ("/open_session", {"capacity_of_str_len": 100, "streaming": True}, 400, "streaming"),
    ("/close_session", {"session_id": "never-opened"}, 404, "session_id"),
    ("/close_session", {}, 400, "session_id"),
    ("/session_hint", {"session_id": "never-opened", "next_use_s": 1}, 404, "session_id"),
    ("/session_hint", {"next_use_s": 1}, 400, "session_id"),
    ("/session_hint", {"session_id": "x", "next_use_s": -1}, 400, "next_use_s"),
    ("/session_hint", {"session_id": "x", "next_use_s": "soon"}, 400, "next_use_s"),
])
def test_bad_session_routes(http, path, body, status, param):
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_bad_session_params_queue_nothing(http):
    sid = http.post("/open_session", json={"capacity_of_str_len": 64}).json()
    assert gen(http, "Hello there", rid="ok", session_params={"id": sid}).status_code == 200
    cases = [
        ({"id": "unknown"}, 404, "session_params.id"),
        ({"id": sid, "rid": "missing"}, 400, "session_params.rid"),
        ({"id": sid, "rid": "ok", "offset": 10**6}, 400, "session_params.offset"),
        ({"id": sid, "offset": -1}, 400, "session_params.offset"),
        ({"id": sid, "bogus": 1}, 400, "session_params.bogus"),
        ({"rid": "ok"}, 400, "session_params.id"),
        ({"id": sid, "rid": "ok"}, 413, "session_params.id"),     # 64-token capacity
    ]
    for params, status, param in cases:
        n = 60 if status == 413 else 8
        r = gen(http, "More words", n=n, rid="bad", session_params=params)
        assert r.status_code == status, (params, r.text)
        assert r.json()["error"]["param"] == param
    both = gen(http, "x", session_params={"id": sid}, session_id="y")
    assert both.status_code == 400 and both.json()["error"]["param"] == "session_id"
    # nothing was queued or registered: the next turn continues normally
    r = gen(http, " fine", rid="ok2", session_params={"id": sid, "rid": "ok"})
    assert r.status_code == 200, r.text
    assert http.post("/close_session", json={"session_id": sid}).status_code == 200


def test_next_use_hints_over_http(client, http):
    """``next_use_s`` on the OpenAI routes and on /generate, ``/session_hint`` after the turn;
    a bad hint is a 400 naming it, with nothing queued or held."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Go."}]
    client.chat.completions.create(model="default", messages=messages, max_tokens=4,
                                   temperature=0, extra_body={"session_id": "hinted",
                                                              "next_use_s": 2.5})
    r = http.post("/session_hint", json={"session_id": "hinted", "next_use_s": 30})
    assert r.status_code == 200 and r.json()["session_id"] == "hinted"
    assert r.json()["held_pages"] > 0
    r = gen(http, "Hello", session_id="hinted-native", next_use_s=4)
    assert r.status_code == 200, r.text
    holds = metrics(http)["agentlang_session_holds"]
    for path, body in [
        ("/v1/chat/completions", {"model": "default", "messages": messages, "max_tokens": 2,
                                  "session_id": "h2", "next_use_s": -1}),
        ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 2,
                             "next_use_s": 3}),                    # no session, no tools
    ]:
        r = http.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "next_use_s", r.text
    r = gen(http, "Hello", session_id="h3", next_use_s=10**6)
    assert r.status_code == 400 and r.json()["error"]["param"] == "next_use_s", r.text
    wait_idle(http)
    assert metrics(http)["agentlang_session_holds"] == holds
    for sid in ("hinted", "hinted-native"):
        assert http.post("/close_session", json={"session_id": sid}).status_code == 200


def test_sessions_are_invisible_across_salts(http):
    sid = http.post("/open_session", json={"capacity_of_str_len": 500,
                                           "cache_salt": "tenant-a"}).json()
    r = gen(http, "Hello", session_params={"id": sid}, cache_salt="tenant-b")
    assert r.status_code == 404 and r.json()["error"]["param"] == "session_params.id"
    r = gen(http, "Hello", rid="salted", session_params={"id": sid}, cache_salt="tenant-a")
    assert r.status_code == 200, r.text
    assert http.post("/close_session", json={"session_id": sid}).status_code == 404
    assert http.post("/close_session", json={"session_id": sid,
                                             "cache_salt": "tenant-a"}).status_code == 200


def test_sglangs_own_client_drives_a_session(server, http):
    """SGLang's ``Runtime.generate(..., session_id=...)`` (its client's session field), attached
    to this server: the first turn's KV is held and the next turn finds it."""
    import json

    pytest.importorskip("sglang", reason="the sglang frontend is installed by `make install`")
    from sglang.lang.backend.runtime_endpoint import Runtime

    class Attached(Runtime):
        def __init__(self, url):           # launches nothing: the server is running
            self.url, self.generate_url, self.pid = url, url + "/generate", None

        def shutdown(self):
            pass

    rt = Attached(server.url)
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    task = SYSTEM + "Task: compare two routes."
    first = json.loads(rt.generate(task, params, session_id="sgl-client"))
    key = "agentlang_session_held_pages_by_session[('session', 'sgl-client')]"
    assert metrics(http)[key] > 0
    second = json.loads(rt.generate(task + first["text"] + " Observation: both closed.", params,
                                    session_id="sgl-client"))
    assert second["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] // 16 * 16
    assert http.post("/close_session", json={"session_id": "sgl-client"}).status_code == 200
