"""Budget-aware completion at the matcher level (no model): shortest completions are valid and
verified, the guard keeps every output a complete match at any budget from the minimum up, and
submit-time checks name the field. Random walks stand in for the model: each step picks a
random allowed token, as the sampler may."""

from __future__ import annotations

import json
import random
import zlib

import jsonschema
import pytest
import torch

import data.schemas as S
from data.validity import is_valid
from agentlang.runtime.grammar import BACKENDS, constraint_from_params, make_grammar_backend
from agentlang.runtime.grammar.base import bitmask_row_ids, bitmask_width
from agentlang.runtime.grammar.budget import BudgetGuard, BudgetTooSmall, check_budget, minimum_tokens

VOCAB_SIZE = 49152
REGEXES = [r"\(\d{3}\) \d{3}-\d{4}", r"[a-z]+@[a-z]+\.(com|org)", r"(yes|no|maybe)"]


@pytest.fixture(scope="module")
def backends(tokenizer):
    return {name: make_grammar_backend(name, tokenizer, VOCAB_SIZE) for name in BACKENDS}


def cases():
    out = [(n, {"json_schema": s}) for n, s, _ in S.SCHEMAS]
    out += [(f"regex{i}", {"regex": r}) for i, r in enumerate(REGEXES)]
    out += [("calc", {"grammar": S.CALC})]
    return out


def walk(compiled, tokenizer, budget: int, rng: random.Random) -> tuple[str, int]:
    """A random constrained decode of at most ``budget`` tokens with the guard on."""
    m = compiled.new_matcher()
    guard = BudgetGuard(compiled, m)
    assert guard.active
    row = torch.zeros(1, bitmask_width(VOCAB_SIZE), dtype=torch.int32)
    out: list[int] = []
    while len(out) < budget and not m.is_terminated():
        m.fill_mask(row, 0)
        allowed = bitmask_row_ids(row[0], VOCAB_SIZE)
        tok = rng.choice(allowed)
        assert m.accept_token(tok)
        tok = guard.settle(m, tok, budget - len(out) - 1).token
        if tok in m.vocab.stop_ids:
            break
        out.append(tok)
    assert m.is_terminated() or m.can_end(), "the budget ran out before a complete match"
    return tokenizer.decode(out), guard.forced


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, kw", cases(), ids=[c[0] for c in cases()])
def test_random_walks_stay_valid_at_every_budget(backends, tokenizer, backend, name, kw):
    try:
        compiled = backends[backend].compile(constraint_from_params(**kw))
    except ValueError as e:
        assert backend == "outlines" and (name in S.OUTLINES_UNSUPPORTED or name == "calc"), e
        pytest.skip(f"{backend} refuses {name}: {e}")
    minimum = minimum_tokens(compiled, "json_schema")
    assert minimum is not None and minimum >= 1
    rng = random.Random(zlib.crc32(f"{backend}/{name}".encode()))
    forced = 0
    for budget in [minimum, minimum + 1] + [minimum + rng.randint(2, 40) for _ in range(3)]:
        text, f = walk(compiled, tokenizer, budget, rng)
        forced += f
        # formats=False: random tokens write dates such as 0000-11-31, which the grammars
        # allow (no backend enforces the calendar); the guard is about completing the match
        assert is_valid(kw, text, formats=False), (budget, text)
    if name in ("nested_address", "array_of_objects", "deep_nesting"):  # free strings: a
        assert forced > 0, "random walk at the minimum budget must have needed forcing"


@pytest.mark.parametrize("backend", BACKENDS)
def test_shortest_completion_leaves_matcher_unchanged(backends, tokenizer, backend):
    compiled = backends[backend].compile(constraint_from_params(json_schema=S.SCHEMAS[1][1]))
    m = compiled.new_matcher()
    for t in tokenizer.encode('{"name":"Bo","address":{"str', add_special_tokens=False):
        assert m.accept_token(t)
    before = (m.num_accepted, m.allowed_token_ids())
    tokens = compiled.completion.search(m).tokens
    assert (m.num_accepted, m.allowed_token_ids()) == before
    text = '{"name":"Bo","address":{"str' + tokenizer.decode(list(tokens))
    assert is_valid({"json_schema": S.SCHEMAS[1][1]}, text), text
    assert text == '{"name":"Bo","address":{"street":"","city":"","zip":"00000"}}'


@pytest.mark.parametrize("backend", BACKENDS)
def test_budget_below_minimum_names_the_field(backends, backend):
    compiled = backends[backend].compile(constraint_from_params(regex=REGEXES[0]))
    minimum = minimum_tokens(compiled, "regex")
    assert check_budget(compiled, minimum, "max_tokens", "regex") == minimum
    with pytest.raises(BudgetTooSmall, match=rf"max_new_tokens: {minimum - 1} .* >= {minimum}"):
        check_budget(compiled, minimum - 1, "max_new_tokens", "regex")


WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
TOOLS = [{"name": "get_weather", "parameters": WEATHER},
         {"name": "add", "parameters": {"type": "object", "properties": {
             "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}]


@pytest.mark.parametrize("seed", range(6))
def test_started_tool_call_is_always_valid(backends, tokenizer, seed):
    """tool_choice="auto": free text until ``<tool_call>``, then a valid call of one of the
    tools, even when the budget runs out inside the call."""
    from agentlang.runtime.server.tools import ToolPlan, ToolSpec

    compiled = backends["xgrammar"].compile(constraint_from_params(tool_calls=TOOLS))
    rng = random.Random(seed)
    prefix = "Let me check. <tool_call>"
    m = compiled.new_matcher()
    guard = BudgetGuard(compiled, m)
    ids = tokenizer.encode(prefix, add_special_tokens=False)
    for t in ids:                                  # the model starting a call
        assert m.accept_token(t)
        guard.settle(m, t, 100)
    budget = len(guard.plan) + rng.randint(0, 12)
    row = torch.zeros(1, bitmask_width(VOCAB_SIZE), dtype=torch.int32)
    out: list[int] = []
    while len(out) < budget and not m.is_terminated():
        m.fill_mask(row, 0)
        tok = rng.choice(bitmask_row_ids(row[0], VOCAB_SIZE))
        assert m.accept_token(tok)
        tok = guard.settle(m, tok, budget - len(out) - 1).token
        if tok in m.vocab.stop_ids:
            break
        out.append(tok)
    text = prefix + tokenizer.decode(out)
    plan = ToolPlan("auto", tuple(ToolSpec(t["name"], None, t["parameters"]) for t in TOOLS))
    parsed = plan.parse(text)
    assert parsed is not None, text
    for call in parsed[0]:
        spec = next(t for t in TOOLS if t["name"] == call["function"]["name"])
        jsonschema.validate(json.loads(call["function"]["arguments"]), spec["parameters"])


def test_tool_calls_constraint_errors_name_the_field(backends):
    with pytest.raises(ValueError, match="tool_calls: item 0 needs a non-empty string name"):
        constraint_from_params(tool_calls=[{"parameters": {}}])
    with pytest.raises(ValueError, match="tool_calls: .*outlines"):
        backends["outlines"].compile(constraint_from_params(tool_calls=TOOLS))
