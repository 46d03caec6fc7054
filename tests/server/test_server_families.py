"""Other chat families through the OpenAI chat route (issue 32), official ``openai`` client
against real servers: the embedded weights served with a Hermes / Qwen3-style template (with
``<think>`` reasoning), a Mistral-style one, a Llama-3-JSON-style one and one in FunctionGemma's
conventions (``call:NAME{k:<escape>v<escape>}``, not JSON) (:mod:`tests.support.families`). Tools reach the model through its own template; calls are
constrained and parsed in its format — in auto mode (a few-shot history makes the small model
call) every started call parses and validates; required / named always give one valid call;
reasoning goes to ``reasoning_content`` (streamed too) and a response format constrains the
answer after it. Bad setups fail clearly: a template that raises, a marker the vocabulary
lacks."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from server_harness import start_server

from tests.server.test_server_tools_auto import ADD, HISTORY, TOOLS, WEATHER
from tests.support.families import family_model

pytestmark = pytest.mark.slow
MODEL = "default"
ANSWER = {"type": "object", "properties": {"city": {"type": "string"},
                                           "temperature": {"type": "integer"}},
          "required": ["city", "temperature"]}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, model_path):
    root = tmp_path_factory.mktemp("families")
    return {name: family_model(model_path, root / name, name) for name in FAMILIES}


FAMILIES = ("hermes_think", "mistral", "llama3_json", "functiongemma")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, dirs):
    from openai import OpenAI

    srv = start_server("--model", str(dirs[request.param]))
    yield request.param, OpenAI(base_url=srv.base_url, api_key="unused", timeout=120,
                                max_retries=0), srv
    srv.stop()


MARKER = {"hermes_think": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3_json": '{"name": ',
          "functiongemma": "<start_function_call>"}


def valid_calls(choice, marker: str) -> int:
    msg = choice.message
    if msg.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for call in msg.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), TOOLS[call.function.name])
        return len(msg.tool_calls)
    assert marker not in (msg.content or ""), (choice.finish_reason, msg.content)
    return 0


def test_started_calls_in_the_familys_format_are_valid(family):
    name, client, _ = family
    calls = 0
    for temperature, seed in ((0.0, 1), (1.0, 3)):
        r = client.chat.completions.create(
            model=MODEL, messages=HISTORY, tools=[WEATHER, ADD], tool_choice="auto", n=3,
            temperature=temperature, seed=seed, max_tokens=40)
        calls += sum(valid_calls(c, MARKER[name]) for c in r.choices)
    print(f"{name}: {calls} calls of 6")
    assert calls >= 1, "the few-shot history in the family's format no longer makes the model call"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_required_and_named_give_one_valid_call(family, choice):
    name, client, _ = family
    r = client.chat.completions.create(
        model=MODEL, messages=HISTORY, tools=[WEATHER, ADD], tool_choice=choice, n=2,
        temperature=1.0, seed=5, max_tokens=64)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c
        call = c.message.tool_calls[0].function
        if isinstance(choice, dict):
            assert call.name == "add"
        jsonschema.validate(json.loads(call.arguments), TOOLS[call.name])


def test_streamed_calls_arrive_parsed(family):
    name, client, _ = family
    stream = client.chat.completions.create(
        model=MODEL, messages=HISTORY, tools=[WEATHER, ADD], tool_choice="required",
        temperature=0, max_tokens=64, stream=True)
    calls = [tc for ch in stream for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices]
    assert len(calls) == 1 and calls[0].function.name in TOOLS
    jsonschema.validate(json.loads(calls[0].function.arguments), TOOLS[calls[0].function.name])


def test_a_thinking_models_answer_is_constrained_after_its_block(family):
    """Thinking on (the default): the response format holds for the answer whether or not the
    model opened a reasoning block (this small model seldom does: the block's split itself is
    tests/chat/test_reasoning.py's); thinking off through ``chat_template_kwargs``: the
    template closes the block in the prompt and nothing is split."""
    name, client, _ = family
    if name != "hermes_think":
        pytest.skip("only the Qwen3-style template thinks")
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    ask = [{"role": "user", "content": "Weather in Oslo? Think first."}]
    for seed in (1, 2):
        r = client.chat.completions.create(model=MODEL, messages=ask, response_format=fmt,
                                           temperature=0.8, seed=seed, max_tokens=80)
        msg = r.choices[0].message
        thought = (msg.model_extra or {}).get("reasoning_content")
        assert thought is None or ("<think>" not in thought and "</think>" not in thought)
        jsonschema.validate(json.loads(msg.content), ANSWER)
    stream = client.chat.completions.create(model=MODEL, messages=ask, response_format=fmt,
                                            temperature=0.8, seed=1, max_tokens=80, stream=True)
    content = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    jsonschema.validate(json.loads(content), ANSWER)
    off = client.chat.completions.create(
        model=MODEL, messages=ask, response_format=fmt, temperature=0, max_tokens=60,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert (off.choices[0].message.model_extra or {}).get("reasoning_content") is None
    jsonschema.validate(json.loads(off.choices[0].message.content), ANSWER)


def test_the_dsl_writes_calls_in_the_familys_format_over_http(family):
    """``/model_info`` names the family (SGLang's ``tool_call_parser`` / ``reasoning_parser``
    and agentlang's ``tool_format``); ``al.RuntimeEndpoint`` reads it and the DSL writes its
    calls in that format (FunctionGemma's, not JSON, stays a bare JSON object over HTTP)."""
    import agentlang as al

    name, _, srv = family
    info = httpx.get(srv.url + "/model_info").json()
    fmt = {"hermes_think": "hermes"}.get(name, name)
    assert info["tool_format"] == fmt
    assert info["tool_call_parser"] == {"hermes_think": "qwen25", "mistral": "mistral",
                                        "llama3_json": "llama3"}.get(name)
    assert info["reasoning_parser"] == ("qwen3" if name == "hermes_think" else None)
    backend = al.RuntimeEndpoint(srv.url)
    assert backend.tool_format() == (None if name == "functiongemma" else fmt)

    @al.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @al.function
    def prog(s):
        s += al.user("What is 2 + 40?")
        s += al.assistant(al.tool_call(add, name="result", max_tokens=40, temperature=0))

    st = prog.run(backend=backend)
    head = {"hermes_think": '<tool_call>\n{"name":"add","arguments":',
            "mistral": '[TOOL_CALLS][{"name":"add","arguments":',
            "llama3_json": '{"name":"add","parameters":',
            "functiongemma": '{"name":"add","arguments":'}[name]
    assert head in st.text(), st.text()
    assert st["result"] == add(**st.get_meta_info("result")["arguments"])


def test_the_familys_template_renders_tools_and_calls_as_hf_does(dirs):
    """What the route renders is HF's ``apply_chat_template`` of the same conversation with
    ``tools``: the assistant's calls kept structured for the template."""
    from transformers import AutoTokenizer

    from agentlang.runtime.chat.family import render
    from agentlang.runtime.server.chat import normalize_messages
    from agentlang.runtime.server.protocol import ChatMessage

    for name, d in dirs.items():
        tok = AutoTokenizer.from_pretrained(d)
        ours = render(tok, normalize_messages([ChatMessage(**m) for m in HISTORY],
                                              structured_calls=True), tools=[WEATHER, ADD])
        hf_msgs = [dict(m, tool_calls=[{"type": "function", "function": {
            "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in m["tool_calls"]]) if m.get("tool_calls") else m for m in HISTORY]
        ref = tok.apply_chat_template(hf_msgs, tools=[WEATHER, ADD], tokenize=False,
                                      add_generation_prompt=True)
        assert ours == ref and "get_weather" in ours
        assert {"hermes_think": "<tool_call>\n{\"name\": \"add\"", "mistral": "[TOOL_CALLS][",
                "llama3_json": "\"parameters\": {\"a\": 17",
                "functiongemma": "<start_function_call>call:add{a:17,b:25}<end_function_call>"
                }[name] in ours


def test_bad_setups_fail_clearly(dirs, model_path, tmp_path):
    bad = family_model(model_path, tmp_path / "broken", "broken")
    srv = start_server("--model", str(bad))
    try:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        assert "chat template failed to render" in r.json()["error"]["message"]
        assert "refuses every conversation" in r.json()["error"]["message"]
    finally:
        srv.stop()
    lacking = family_model(model_path, tmp_path / "lacking", "hermes_think", rename=False)
    with pytest.raises(RuntimeError, match="'<tool_call>' is not a token of the vocabulary"):
        start_server("--model", str(lacking), timeout=120)
