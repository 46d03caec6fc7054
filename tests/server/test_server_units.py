"""Pure pieces of the server, no model: tool planning and parsing, error mapping, token bytes."""

from __future__ import annotations

import json

import jsonschema
import pytest

from agentlang.runtime.server.errors import APIError, from_value_error, loc_to_param
from agentlang.runtime.server.openai.chat import _could_be_call
from agentlang.runtime.server.protocol import Tool
from agentlang.runtime.server.tools import plan_tools

WEATHER = Tool.model_validate({"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}})
NOARGS = Tool.model_validate({"type": "function", "function": {"name": "ping"}})


def test_auto_parses_tagged_and_bare_calls_else_content():
    plan = plan_tools([WEATHER, NOARGS], None)
    assert plan.mode == "auto" and plan.active and not plan.enforced
    calls, rest = plan.parse('Sure. <tool_call>{"name": "get_weather", "arguments": '
                             '{"city": "Oslo"}}</tool_call>')
    assert rest == "Sure." and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    calls, rest = plan.parse('```json\n{"name": "ping", "arguments": {}}\n```')
    assert rest is None and calls[0]["function"]["name"] == "ping"
    two = plan.parse('<tool_call>{"name": "ping", "arguments": {}}</tool_call>\n'
                     '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"A\\"}"}'
                     '</tool_call>')
    assert [c["function"]["name"] for c in two[0]] == ["ping", "get_weather"]
    assert plan.parse("The weather is nice.") is None
    assert plan.parse('{"name": "unknown", "arguments": {}}') is None
    assert plan.parse('{"name": "get_weather", "arguments": {"town": "x"}}') is None  # invalid
    assert plan.parse('{"name": "get_weather", "arguments": {"city": "x"}, "x": 1}') is None


def test_enforced_schema_validates_only_real_calls():
    req = plan_tools([WEATHER, NOARGS], "required")
    schema = req.constraint_schema()
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "A"}}, schema)
    jsonschema.validate({"name": "ping", "arguments": {}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {}}, schema)
    named = plan_tools([WEATHER, NOARGS], {"type": "function", "function": {"name": "ping"}})
    assert named.mode == "named" and named.constraint_schema()["properties"]["name"] == \
        {"const": "ping"}
    assert list(named.constraint_schema()["properties"]) == ["name", "arguments"]
    assert not plan_tools([WEATHER], "none").active


@pytest.mark.parametrize("tools,choice,param", [
    ([], None, "tools"),
    ([WEATHER, WEATHER], None, "tools"),
    (None, "auto", "tool_choice"),
    ([WEATHER], "always", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
])
def test_plan_tools_errors_name_the_field(tools, choice, param):
    with pytest.raises(APIError) as e:
        plan_tools(tools, choice)
    assert e.value.status == 400 and e.value.param == param


def test_streaming_holds_back_only_what_may_be_a_call():
    t = "<tool_call>"
    assert _could_be_call("", t) is None and _could_be_call("  <tool", t) is None
    assert _could_be_call("<tool_call>{", t) is True and _could_be_call(' {"name"', t) is True
    assert _could_be_call("Hello", t) is False and _could_be_call("<b>", t) is False
    m = "[TOOL_CALLS]"                                   # another family's trigger
    assert _could_be_call("[TOOL", m) is None and _could_be_call("[TOOL_CALLS][{", m) is True
    assert _could_be_call("<tool_call>", m) is False


def test_error_mapping():
    assert loc_to_param(("body", "messages", 0, "role")) == "messages[0].role"
    e = from_value_error(ValueError("logprobs: must be in [0, 20], got 50"),
                         {"logprobs": "top_logprobs"})
    assert e.param == "top_logprobs" and e.message.startswith("top_logprobs: ")
    from agentlang.runtime.core.errors import EngineError, EngineValueError, ErrorCode

    typed = EngineError(ErrorCode.CONTEXT_EXCEEDED, "prompt",
                        "9000 tokens, the model's context is 8192 tokens")
    e = from_value_error(EngineValueError(typed), {"prompt": "text"})
    assert e.status == 400 and e.code == "context_length_exceeded" and e.param == "text"
    assert e.message == "text: 9000 tokens, the model's context is 8192 tokens"
    e = from_value_error(ValueError(str(typed)))         # the same text, untyped: no code
    assert e.code is None and e.param == "prompt"
    e = from_value_error(ValueError("unknown sampling field(s) ['x']"), None, "sampling_params")
    assert e.param == "sampling_params" and e.message.startswith("sampling_params: ")
    assert e.body() == {"error": {"message": e.message, "type": "invalid_request_error",
                                  "param": "sampling_params", "code": None}}


def test_token_bytes_are_exact(tokenizer):
    from agentlang.runtime.server.logprobs import TokenTexts

    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("héllo wörld ✓")
    joined = b"".join(texts.get(t)[1] for t in ids)
    assert joined.decode("utf-8") == "héllo wörld ✓"
    assert texts.get(ids[0])[0] == tokenizer.decode(ids[:1])
