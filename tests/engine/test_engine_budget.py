"""Budget-aware completion through the engine: constrained outputs are valid at every budget
from the minimum up (both backends, greedy and hot sampling, n > 1, jump-forward on and off),
the feature changes nothing when the budget does not matter, and budgets below the minimum
are refused at submit naming ``max_tokens``."""

import json

import jsonschema
import pytest

from data.schemas import SCHEMAS
from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.grammar.budget import BudgetTooSmall

pytestmark = pytest.mark.slow

QTY = {"type": "object", "properties": {"item": {"type": "string"}, "qty": {"type": "integer"}},
       "required": ["item", "qty"]}


@pytest.fixture(scope="module", params=["xgrammar", "outlines"])
def eng(request, model_path):
    return Engine(model_path, page_size=16, kv_budget_mb=128, grammar_backend=request.param)


def chat(text):
    return [{"role": "user", "content": text}]


def minimum(eng, **constraint):
    """The smallest budget the engine accepts for ``constraint``, or None when the backend
    refuses the constraint itself (an outlines limit: reported on the output, nothing raised)."""
    try:
        out = eng.generate("x", SamplingParams(max_tokens=1, **constraint))
    except BudgetTooSmall as e:
        assert "max_tokens: 1 is below" in str(e)
        return e.minimum
    assert out.error is not None, f"max_tokens=1 neither refused nor failed: {out.outputs}"
    return None


@pytest.mark.parametrize("temperature", [0.0, 1.5])
@pytest.mark.parametrize("jump_forward", [True, False])
def test_tight_budgets_give_valid_json(eng, temperature, jump_forward):
    low = minimum(eng, json_schema=QTY)
    assert low is not None
    budgets = [low, low + 1, low + 3, low + 8, low + 20]
    outs = eng.generate([chat("Order a long list of many things as JSON.")] * len(budgets),
                        [SamplingParams(max_tokens=b, temperature=temperature, seed=7, n=2,
                                        json_schema=QTY, jump_forward=jump_forward)
                         for b in budgets])
    forced = 0
    for b, out in zip(budgets, outs):
        for c in out.outputs:
            assert len(c.token_ids) <= b
            jsonschema.validate(json.loads(c.text), QTY)
            forced += c.forced_completion_tokens
    assert forced > 0


def test_schema_set_at_the_minimum_budget(eng):
    backend = eng.config.grammar_backend
    for name, schema, _ in SCHEMAS[:8]:
        low = minimum(eng, json_schema=schema)
        if low is None:           # outlines refuses some schemas: reported when the request runs
            assert backend == "outlines", name
            continue
        out = eng.generate(chat(f"Describe {name} at length in JSON."),
                           SamplingParams(max_tokens=low, temperature=1.0, seed=1,
                                          json_schema=schema))
        jsonschema.validate(json.loads(out.text), schema)


ENUMS = next(s for n, s, _ in SCHEMAS if n == "enums")   # no free text: always ends early


@pytest.mark.parametrize("constraint", [{"regex": r"(yes|no|maybe), because [a-z ]{1,40}\."},
                                        {"json_schema": ENUMS}], ids=["regex", "json_schema"])
def test_same_tokens_when_the_budget_does_not_matter(eng, constraint):
    """Batched (n=2, two temperatures) and streamed: token-identical with the guard on and off
    when every output ends (``stop``) before the budget could matter."""
    prompts = [chat("Is the sky blue?"), chat("Rate this ticket as JSON.")]

    def params(flag, t):
        return SamplingParams(max_tokens=60, temperature=t, seed=3, n=2,
                              complete_within_budget=flag, **constraint)
    on, off = (eng.generate(prompts * 2, [params(flag, t) for t in (1.0, 1.5) for _ in prompts])
               for flag in (True, False))
    for a, b in zip(on, off):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        assert all(c.finish_reason == "stop" and c.forced_completion_tokens == 0
                   for c in a.outputs), [(c.finish_reason, c.text) for c in a.outputs]
    streamed = {}
    for flag in (True, False):
        ids = {0: [], 1: []}
        for d in eng.generate_stream(prompts[1], params(flag, 1.5)):
            ids[d.index] += d.token_ids
        streamed[flag] = ids
    assert streamed[True] == streamed[False]
    assert [streamed[True][i] for i in (0, 1)] == [c.token_ids for c in on[3].outputs]


def test_refusal_queues_nothing(eng):
    before = eng.metrics()
    with pytest.raises(ValueError, match=r"max_tokens: 2 is below .* >= \d+"):
        eng.generate("x", SamplingParams(max_tokens=2, json_schema=QTY))
    after = eng.metrics()
    assert after["num_running"] == before["num_running"] == 0
    assert after["num_waiting"] == before["num_waiting"] == 0
    out = eng.generate("Still here?", SamplingParams(max_tokens=2, temperature=0))
    assert out.error is None
