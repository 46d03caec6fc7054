"""The OpenAI-compatible API, driven by the official ``openai`` client against the real server."""

from __future__ import annotations

import json

import jsonschema
import pytest

pytestmark = pytest.mark.slow

MODEL = "default"
QUESTION = [{"role": "user", "content": "Name three colors."}]
LONG_CONTEXT = ("The committee reviewed the quarterly report on river water quality, noting "
                "the sampling sites, the dates of collection, the laboratory methods used for "
                "nitrate and phosphate, and the corrective actions proposed for the two sites "
                "that exceeded the limits. ") * 2


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct"]


def test_chat_completion_shape_and_usage(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6,
                                       temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= r.usage.completion_tokens <= 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_streamed_chat_equals_non_streamed_greedy(client):
    kw = dict(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0)
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == plain.choices[0].finish_reason and finishes.count(None) == len(finishes) - 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        plain.usage.completion_tokens


def test_completion_stream_equals_non_streamed(client):
    kw = dict(model=MODEL, prompt="The three primary colors are", max_tokens=8, temperature=0)
    plain = client.completions.create(**kw)
    text = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True)
                   if c.choices)
    assert text == plain.choices[0].text and plain.object == "text_completion"


def test_n3_gives_three_choices(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, n=3,
                                       temperature=1.0, seed=11, logprobs=True)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    assert len({c.message.content for c in r.choices}) > 1


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for tok in content:
        tops = [t.logprob for t in tok.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert tok.top_logprobs[0].token == tok.token          # greedy picks the best
        assert abs(tok.logprob - tops[0]) < 1e-5
        assert bytes(tok.bytes).decode("utf-8", errors="replace") == tok.token
    assert "".join(t.token for t in content).startswith(r.choices[0].message.content[:3])


def test_completion_logprobs_and_stop_string(client):
    full = client.completions.create(model=MODEL, prompt="Count: 1, 2, 3, 4,", max_tokens=8,
                                     temperature=0).choices[0]
    assert "," in full.text
    cut = client.completions.create(model=MODEL, prompt="Count: 1, 2, 3, 4,", max_tokens=8,
                                    temperature=0, stop=[","], logprobs=2).choices[0]
    assert cut.text == full.text[:full.text.index(",")] and cut.finish_reason == "stop"
    lp = cut.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) >= 1
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0


def test_seed_reproducibility(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a word."}],
              max_tokens=5, temperature=1.2, top_p=0.95)
    a = client.chat.completions.create(**kw, seed=1234).choices[0].message.content
    b = client.chat.completions.create(**kw, seed=1234).choices[0].message.content
    assert a == b
    others = {client.chat.completions.create(**kw, seed=s).choices[0].message.content
              for s in (1, 2)}
    assert len(others | {a}) > 1, "different seeds should not all give the same sample"


def test_response_format_json_schema(client):
    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 12},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"]}
    r = client.chat.completions.create(
        model=MODEL, max_tokens=40, temperature=0,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_response_format_json_object(client):
    r = client.chat.completions.create(
        model=MODEL, max_tokens=30, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Reply with a JSON object like {"name": "Bob"}.'}])
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 24},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object",
                                       "properties": {"tz": {"type": "string", "maxLength": 12}},
                                       "required": ["tz"]}}}


def test_tools_required_arguments_validate(client):
    r = client.chat.completions.create(
        model=MODEL, max_tokens=48, temperature=0, tools=[WEATHER, TIME], tool_choice="required",
        messages=[{"role": "user", "content": "What's the weather in Paris?"}])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    assert call.id.startswith("call_") and call.type == "function"


def test_tools_named_choice_streamed(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, max_tokens=32, temperature=0, tools=[WEATHER, TIME], stream=True,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        messages=[{"role": "user", "content": "What time is it in Tokyo?"}]))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_time"
    jsonschema.validate(json.loads(calls[0].function.arguments), TIME["function"]["parameters"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_tool_choice_none_and_tool_history(client):
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "call_1", "type": "function",
                   "function": {"name": "get_weather",
                                "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"}]
    r = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0,
                                       tools=[WEATHER], tool_choice="none", messages=history)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


def test_extras_regex_and_choices(client):
    r = client.completions.create(model=MODEL, prompt="My phone number is", max_tokens=16,
                                  temperature=0, extra_body={"regex": r" \d{3}-\d{4}"})
    import re

    assert re.fullmatch(r" \d{3}-\d{4}", r.choices[0].text)
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8,
                                       temperature=0, extra_body={"choices": ["red", "blue"]})
    assert r.choices[0].message.content in ("red", "blue")


def test_repeated_prompt_reports_cached_tokens(client):
    messages = [{"role": "system", "content": LONG_CONTEXT},
                {"role": "user", "content": "Summarize in one word."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                           temperature=0)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                            temperature=0)
    assert first.usage.prompt_tokens == second.usage.prompt_tokens > 64
    assert second.usage.prompt_tokens_details.cached_tokens >= 64


def test_cache_salt_isolates_tenants(client):
    messages = [{"role": "system", "content": "Tenant notes. " + LONG_CONTEXT},
                {"role": "user", "content": "One word?"}]

    def cached(salt: str) -> int:
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1,
                                           temperature=0, extra_body={"cache_salt": salt})
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-a") >= 64
    assert cached("tenant-b") == 0
