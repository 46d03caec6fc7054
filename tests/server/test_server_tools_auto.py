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


# (temperature, max_tokens, seeds, calls at least): at 24 tokens no call fits after the model's
# "<tool_call": the guard ends the output instead of starting a call it cannot finish. Choice i
# of a request with seed s samples with seed s + i, so seeds 3 apart give distinct samples. At
# T 1.5 a sample starts a call within 40 tokens ~18 % of the time (10 / 60 and 11 / 60 distinct
# samples, measured with torch.multinomial's draw and with the inverted running sum): 36
# samples leave a run without a call a 0.1 % chance.
SEEDS = (1, 4)
CASES = [(0.0, 30, SEEDS, 1), (0.7, 32, SEEDS, 3), (1.0, 24, SEEDS, 0), (1.0, 40, SEEDS, 3),
         (1.5, 40, tuple(range(1, 36, 3)), 1)]


@pytest.mark.parametrize("temperature, max_tokens, seeds, at_least", CASES)
def test_started_calls_are_valid(client, temperature, max_tokens, seeds, at_least):
    calls = 0
    for seed in seeds:
        r = client.chat.completions.create(
            model=MODEL, messages=HISTORY, tools=[WEATHER, ADD], tool_choice="auto", n=3,
            temperature=temperature, seed=seed, max_tokens=max_tokens)
        for choice in r.choices:
            calls += check_choice(choice)
    print(f"temperature {temperature}, max_tokens {max_tokens}: {calls} calls of {3 * len(seeds)}")
    assert calls >= at_least, "the few-shot history no longer makes the model call a tool"


def test_streamed_started_call_is_valid(client):
    """Streams until one starts a call (at T 0.7 ~9 samples in 10 do: three seeds leave a run
    without one a 0.1 % chance); every streamed output holds no broken call."""
    started = []
    for seed in (3, 6, 9):
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=HISTORY, tools=[WEATHER, ADD], tool_choice="auto",
            stream=True, temperature=0.7, seed=seed, max_tokens=32))
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert "<tool_call>" not in text, text
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), TOOLS[call.function.name])
        started += calls
        if started:
            break
    assert started, "no streamed output started a call"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
