"""``tool_choice="auto"`` through the OpenAI route (issue 16), official ``openai`` client against
the real server: the model may answer in text, but every call it starts (``<tool_call>``) is a
valid call of one of the tools, even when ``max_tokens`` runs out inside it. A few-shot history
of earlier calls makes the small model start calls; several seeds and temperatures, budgets
around the length of a call so the budget guard has to close some of them."""

from __future__ import annotations

import json

import jsonschema
import pytest

pytestmark = pytest.mark.slow

MODEL = "default"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "days", "unit"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}},
                   "required": ["a", "b"]}}}
TOOLS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}


def _call(i: int, name: str, args: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{i}", "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)}}]}


HISTORY = [
    {"role": "user", "content": "Weather in Oslo for the next 3 days?"},
    _call(1, "get_weather", {"city": "Oslo", "days": 3, "unit": "celsius"}),
    {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"},
    {"role": "user", "content": "What is 17 plus 25?"},
    _call(2, "add", {"a": 17, "b": 25}),
    {"role": "tool", "tool_call_id": "call_2", "content": "42"},
    {"role": "user", "content": "And the weather in Buenos Aires, in fahrenheit, for a week?"},
]


def check_choice(choice) -> int:
    """Asserts the choice holds no broken call; returns how many calls it made."""
    msg = choice.message
    if msg.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for call in msg.tool_calls:
            assert call.function.name in TOOLS, call
            jsonschema.validate(json.loads(call.function.arguments), TOOLS[call.function.name])
        return len(msg.tool_calls)
    # a call the server could not parse stays in the content: a started call must never do so
    assert "<tool_call>" not in (msg.content or ""), (choice.finish_reason, msg.content)
    return 0


# (temperature, max_tokens, calls at least): at 24 tokens no call fits after the model's
# "<tool_call": the guard ends the output instead of starting a call it cannot finish
CASES = [(0.0, 30, 1), (0.7, 32, 3), (1.0, 24, 0), (1.0, 40, 3), (1.5, 40, 1)]


@pytest.mark.parametrize("temperature, max_tokens, at_least", CASES)
def test_started_calls_are_valid(client, temperature, max_tokens, at_least):
    calls = 0
    for seed in (1, 2):
        r = client.chat.completions.create(
            model=MODEL, messages=HISTORY, tools=[WEATHER, ADD], tool_choice="auto", n=3,
            temperature=temperature, seed=seed, max_tokens=max_tokens)
        for choice in r.choices:
            calls += check_choice(choice)
    print(f"temperature {temperature}, max_tokens {max_tokens}: {calls} calls of 6")
    assert calls >= at_least, "the few-shot history no longer makes the model call a tool"


def test_streamed_started_call_is_valid(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=HISTORY, tools=[WEATHER, ADD], tool_choice="auto", stream=True,
        temperature=0.7, seed=3, max_tokens=32))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in text, text
    assert calls, text
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), TOOLS[call.function.name])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
