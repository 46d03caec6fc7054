"""Malformed requests get the right status and an OpenAI-style error body naming the field,
and the server keeps serving; a second instance with ``--api-key`` answers 401 without it and
shuts down cleanly on Ctrl-C (SIGINT)."""

from __future__ import annotations

import signal

import httpx
import pytest
from server_harness import API_KEY, start_server

from agentlang.runtime.server.auth import OPEN_PATHS

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def chat(**fields) -> dict:
    return {"model": "default", "messages": MSGS, "max_tokens": 2, **fields}


# (id, method, path, body (dict | bytes | None), status, param or None)
CASES = [
    ("bad-json", "POST", CHAT, b"{not json", 400, None),
    ("body-not-object", "POST", CHAT, b"[1, 2]", 400, None),
    ("missing-messages", "POST", CHAT, {"model": "default"}, 400, "messages"),
    ("empty-messages", "POST", CHAT, chat(messages=[]), 400, "messages"),
    ("messages-not-list", "POST", CHAT, chat(messages="hi"), 400, "messages"),
    ("unknown-role", "POST", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400,
     "messages[0].role"),
    ("content-wrong-type", "POST", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400,
     "messages[0].content"),
    ("image-part", "POST", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400,
     "messages[0].content[0]"),
    ("temperature-string", "POST", CHAT, chat(temperature="hot"), 400, "temperature"),
    ("temperature-negative", "POST", CHAT, chat(temperature=-1), 400, "temperature"),
    ("max-tokens-zero", "POST", CHAT, chat(max_tokens=0), 400, "max_tokens"),
    ("max-tokens-negative", "POST", CHAT, chat(max_tokens=-5), 400, "max_tokens"),
    ("max-tokens-float", "POST", CHAT, chat(max_tokens=2.5), 400, "max_tokens"),
    ("max-completion-tokens-negative", "POST", CHAT,
     chat(max_tokens=None, max_completion_tokens=-1), 400, "max_completion_tokens"),
    ("huge-n", "POST", CHAT, chat(n=100000), 400, "n"),
    ("n-zero", "POST", CHAT, chat(n=0), 400, "n"),
    ("top-p-too-big", "POST", CHAT, chat(top_p=1.5), 400, "top_p"),
    ("top-logprobs-too-big", "POST", CHAT, chat(logprobs=True, top_logprobs=50), 400,
     "top_logprobs"),
    ("top-logprobs-without-logprobs", "POST", CHAT, chat(top_logprobs=2), 400, "top_logprobs"),
    ("presence-penalty-range", "POST", CHAT, chat(presence_penalty=5), 400, "presence_penalty"),
    ("stop-wrong-type", "POST", CHAT, chat(stop=["a", 3]), 400, "stop"),
    ("seed-string", "POST", CHAT, chat(seed="x"), 400, "seed"),
    ("stream-not-bool", "POST", CHAT, chat(stream="yes"), 400, "stream"),
    ("stream-options-without-stream", "POST", CHAT, chat(stream_options={"include_usage": True}),
     400, "stream_options"),
    ("unknown-model", "POST", CHAT, chat(model="gpt-4"), 400, "model"),
    ("response-format-type", "POST", CHAT, chat(response_format={"type": "xml"}), 400,
     "response_format.type"),
    ("response-format-no-schema", "POST", CHAT,
     chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400,
     "response_format.json_schema.schema"),
    ("invalid-json-schema", "POST", CHAT, chat(response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}),
     400, "response_format"),
    ("bad-regex", "POST", CHAT, chat(regex="(unclosed"), 400, "regex"),
    ("bad-grammar", "POST", CHAT, chat(grammar="start: ???"), 400, "grammar"),
    ("empty-choices", "POST", CHAT, chat(choices=[]), 400, "choices"),
    ("regex-matching-nothing", "POST", CHAT, chat(regex=r"ab[^\s\S]"), 400, "regex"),
    ("min-items-above-max-items", "POST", CHAT, chat(response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "array", "minItems": 3, "maxItems": 1}}}), 400, "response_format"),
    ("endless-grammar", "POST", CHAT, chat(grammar='start: "a" x\nx: "b" x'), 400, "grammar"),
    ("generate-enum-against-pattern", "POST", "/generate", {"text": "x", "sampling_params": {
        "json_schema": {"type": "string", "enum": ["abc"], "pattern": "^[0-9]+$"}}}, 400,
     "sampling_params.json_schema"),
    ("two-constraints", "POST", CHAT, chat(regex="a+", choices=["a"]), 400, "choices"),
    ("tool-type", "POST", CHAT, chat(tools=[{"type": "retrieval", "function": {"name": "x"}}]),
     400, "tools[0].type"),
    ("tool-name", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "a b"}}]),
     400, "tools[0].function.name"),
    ("tool-schema-invalid", "POST", CHAT, chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": 5}}}]), 400, "tools[0].function.parameters"),
    ("tool-schema-not-object", "POST", CHAT, chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}]), 400, "tools[0].function.parameters"),
    ("tool-choice-unknown-function", "POST", CHAT, chat(tools=[TOOL], tool_choice={
        "type": "function", "function": {"name": "g"}}), 400, "tool_choice"),
    ("tool-choice-bad-value", "POST", CHAT, chat(tools=[TOOL], tool_choice="sometimes"), 400,
     "tool_choice"),
    ("tool-choice-without-tools", "POST", CHAT, chat(tool_choice="required"), 400,
     "tool_choice"),
    ("logit-bias", "POST", CHAT, chat(logit_bias={"1": 5}), 400, "logit_bias"),
    ("prompt-too-long", "POST", CHAT,
     chat(messages=[{"role": "user", "content": "word " * 3000}]), 400, "messages"),
    ("max-tokens-over-limit", "POST", CHAT, chat(max_tokens=100000), 400, "max_tokens"),
    ("min-tokens-over-max", "POST", CHAT, chat(min_tokens=5, max_tokens=2), 400, "min_tokens"),
    ("top-k-negative", "POST", CHAT, chat(top_k=-5), 400, "top_k"),
    ("completion-no-prompt", "POST", "/v1/completions", {"model": "default"}, 400, "prompt"),
    ("completion-empty-prompt-list", "POST", "/v1/completions",
     {"model": "default", "prompt": []}, 400, "prompt"),
    ("completion-token-out-of-vocab", "POST", "/v1/completions",
     {"model": "default", "prompt": [1, 99999999]}, 400, "prompt"),
    ("completion-prompt-dicts", "POST", "/v1/completions",
     {"model": "default", "prompt": [{"a": 1}]}, 400, "prompt[0]"),
    ("completion-logprobs-too-big", "POST", "/v1/completions",
     {"model": "default", "prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("completion-echo-logprobs", "POST", "/v1/completions",
     {"model": "default", "prompt": "x", "echo": True, "logprobs": 1}, 400, "echo"),
    ("generate-unknown-sampling-field", "POST", "/generate",
     {"text": "x", "sampling_params": {"bogus": 1}}, 400, "sampling_params.bogus"),
    ("generate-text-and-ids", "POST", "/generate", {"text": "x", "input_ids": [1]}, 400, "text"),
    ("generate-negative-max-tokens", "POST", "/generate",
     {"text": "x", "sampling_params": {"max_new_tokens": -1}}, 400,
     "sampling_params.max_new_tokens"),
    ("generate-bad-schema", "POST", "/generate",
     {"text": "x", "sampling_params": {"json_schema": {"type": "nonsense"}}}, 400,
     "sampling_params.json_schema"),
    ("detokenize-out-of-range", "POST", "/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("release-unknown-handle", "POST", "/release_prefix", {"handle": "nope"}, 400, "handle"),
    ("score-no-continuations", "POST", "/score", {"prefix": "x", "continuations": []}, 400,
     "continuations"),
    ("unknown-route", "POST", "/v1/nothing", {}, 404, None),
    ("wrong-method", "GET", CHAT, None, 405, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_request_gets_openai_error(http, case):
    _, method, path, body, status, param = case
    if isinstance(body, bytes):
        r = http.request(method, path, content=body, headers={"content-type": "application/json"})
    elif body is None:
        r = http.request(method, path)
    else:
        r = http.request(method, path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    if param is not None:
        assert param.split("[")[0].split(".")[0] in err["message"]


def test_enough_malformed_cases():
    assert len(CASES) >= 30


def test_too_long_prompt_names_the_limit(http):
    r = http.post(CHAT, json=chat(messages=[{"role": "user", "content": "word " * 3000}]))
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "limit" in err["message"]
    assert str(http.get("/get_model_info").json()["max_tokens_per_sequence"]) in err["message"]


def test_server_still_serves_after_errors(http, client):
    r = client.chat.completions.create(model="default", messages=MSGS, max_tokens=2)
    assert r.choices[0].message.content is not None
    assert http.get("/health").json()["status"] == "ok"


@pytest.fixture(scope="module")
def auth_server():
    srv = start_server("--api-key", API_KEY, "--kv-budget-mb", "8")
    yield srv
    srv.stop(signal.SIGKILL)


@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("POST", CHAT),
                                         ("POST", "/generate"), ("GET", "/metrics"),
                                         ("GET", "/get_model_info"), ("POST", "/v1/nothing")])
@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_api_key_required(auth_server, method, path, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.request(method, auth_server.url + path, headers=headers, json={}, timeout=30)
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    assert set(err) == {"message", "type", "param", "code"}


def test_api_key_documented_in_openapi(auth_server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    doc = httpx.get(auth_server.url + "/openapi.json", headers=headers, timeout=30).json()
    for path, item in doc["paths"].items():
        for op in item.values():
            assert ("401" in op["responses"]) == (path not in OPEN_PATHS), path


def test_api_key_accepted_then_ctrl_c_stops_cleanly(auth_server):
    from openai import AuthenticationError, OpenAI

    assert httpx.get(auth_server.url + "/health").status_code == 200     # open
    good = OpenAI(base_url=auth_server.base_url, api_key=API_KEY, max_retries=0)
    r = good.chat.completions.create(model="default", messages=MSGS, max_tokens=2)
    assert r.usage.completion_tokens >= 1
    bad = OpenAI(base_url=auth_server.base_url, api_key="nope", max_retries=0)
    with pytest.raises(AuthenticationError):
        bad.models.list()
    assert auth_server.stop(signal.SIGINT) == 0
    log = auth_server.log()
    assert f"serving SmolLM2-135M-Instruct at {auth_server.url}" in log and "KV pool" in log


def test_unsatisfiable_constraints_are_typed_400s(http):
    """A constraint no output satisfies is refused before anything is queued, with the same
    typed code as any other bad constraint, on the OpenAI and the native routes."""
    bad = [(CHAT, chat(regex=r"[^\s\S]")),
           (CHAT, chat(response_format={"type": "json_schema", "json_schema": {
               "name": "x", "schema": {"type": "string", "minLength": 5, "maxLength": 2}}})),
           ("/generate", {"text": "x", "sampling_params": {"regex": r"a[^\s\S]"}})]
    for path, body in bad:
        r = http.post(path, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_constraint", r.text
        assert "no" in r.json()["error"]["message"]
    assert http.get("/health").json()["status"] == "ok"
