"""Speculation on the embedded model: outputs token-identical with it on and off — greedy,
seeded sampling, n > 1, logprobs, a JSON schema, preemption, batches — on the default model
path (the GGUF kept quantized, float32 activations: verify rows run the native decode layer,
bitwise the arithmetic of one-token steps) and on the dense float32 path; drafts are accepted
on copy-heavy prompts; no page is left behind."""

from __future__ import annotations

import json

import jsonschema
import pytest

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.weights.model_loader import resolve_model

pytestmark = pytest.mark.slow

CODE = '''def scale(values, factor):
    """Multiply every value by factor."""
    result = []
    for value in values:
        result.append(value * factor)
    return result
'''
COPY_PROMPTS = [
    "Rewrite this function with `values` renamed to `items`:\n\n" + CODE + "\nAnswer:\n",
    "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps "
    "over the lazy dog, the quick brown fox",
    "Invoice 2026-0117 from Northwind Traders Ltd., 14 Harbour Street, Bristol. Total EUR "
    "911.13.\nThe seller is",
]
SCHEMA = {"type": "object", "properties": {
    "invoice": {"type": "string"}, "seller": {"type": "string"}, "total": {"type": "string"}},
    "required": ["invoice", "seller", "total"]}


@pytest.fixture(scope="module")
def native():
    eng = Engine(resolve_model("default", "auto").path, weights="auto", kv_budget_mb=64)
    if eng.model.native_decoder is None:
        pytest.skip("the native decode layer does not run on this CPU (no AVX2 / AVX-512 build)")
    return eng


def both(eng, prompts, **params):
    """Outputs with speculation off, then on (cold cache each time)."""
    outs = []
    for spec in (False, True):
        eng.flush_cache()
        outs.append(eng.generate(prompts, SamplingParams(speculative=spec, **params)))
    return outs


def assert_identical(off, on, logprobs=None):
    """Same tokens and text; logprobs ``"bitwise"`` or ``"close"`` (to 2e-3)."""
    for a, b in zip(off, on):
        for x, y in zip(a.outputs, b.outputs):
            assert x.token_ids == y.token_ids and x.text == y.text
            if logprobs == "bitwise":
                assert x.logprobs == y.logprobs
            elif logprobs == "close":
                for u, v in zip(x.logprobs, y.logprobs, strict=True):
                    assert u.token_id == v.token_id and abs(u.logprob - v.logprob) < 2e-3
                    assert [t for t, _ in u.top] == [t for t, _ in v.top]


def test_greedy_identical_and_drafts_accepted(native):
    off, on = both(native, COPY_PROMPTS, max_tokens=64, temperature=0, ignore_eos=True)
    assert_identical(off, on)
    assert sum(o.meta["spec_accepted_tokens"] for o in on) >= 20
    assert sum(o.meta["spec_draft_tokens"] for o in off) == 0
    m = native.metrics()
    assert m["spec_accepted_tokens"] >= 20 and m["spec_verify_steps"] > 0


def test_alone_equals_batched(native):
    """A request alone (batch 1: long drafts) and in a batch (shorter drafts) agree."""
    alone = [native.generate(p, SamplingParams(max_tokens=48, temperature=0, ignore_eos=True,
                                               speculative=True)) for p in COPY_PROMPTS]
    native.flush_cache()
    batched = native.generate(COPY_PROMPTS, SamplingParams(max_tokens=48, temperature=0,
                                                           ignore_eos=True, speculative=True))
    assert_identical(alone, batched)


def test_seeded_sampling_and_logprobs_bitwise(native):
    """One sequence a step: every verify row runs the native decode layer, so the logprobs
    are those of one-token steps, bit for bit."""
    for p in COPY_PROMPTS[:2]:
        off, on = both(native, [p], max_tokens=40, temperature=0.8, top_p=0.95, seed=11,
                       logprobs=3, ignore_eos=True)
        assert_identical(off, on, logprobs="bitwise")
        assert len(on[0].outputs[0].logprobs) == 40


def test_n2_siblings_identical(native):
    """n = 2: the siblings share their prompt's pages, so their steps run the torch kernels
    (cascade decode without drafts, extend with them), whose sums differ in the last bits
    (4e-4 in a logprob seen here): the same tokens, logprobs to 2e-3."""
    off, on = both(native, COPY_PROMPTS[:2], max_tokens=40, temperature=0.8, top_p=0.95,
                   seed=11, n=2, logprobs=3, ignore_eos=True)
    assert_identical(off, on, logprobs="close")
    assert sum(o.meta["spec_draft_tokens"] for o in on) > 0


def test_json_schema_identical_and_valid(native):
    prompt = native.apply_chat_template([{"role": "user", "content": COPY_PROMPTS[2]
                                          + " ... Give invoice, seller and total as JSON."}])
    off, on = both(native, [prompt], max_tokens=80, temperature=0, json_schema=SCHEMA)
    assert_identical(off, on)
    jsonschema.validate(json.loads(on[0].outputs[0].text), SCHEMA)


def test_preemption_keeps_outputs():
    small = Engine(resolve_model("default", "auto").path, weights="auto", num_pages=40,
                   page_size=4, speculative=True)        # 160 tokens: one request fits, not three
    big = Engine(resolve_model("default", "auto").path, weights="auto", kv_budget_mb=64)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    ref = big.generate(COPY_PROMPTS, params)
    got = small.generate(COPY_PROMPTS, params)
    assert small.metrics()["preemptions"] > 0 and small.metrics()["spec_draft_tokens"] > 0
    assert_identical(ref, got)
    small.flush_cache()
    assert small.metrics()["pages_used"] == 0


def test_dense_float32_path_identical(model_path):
    eng = Engine(model_path, kv_budget_mb=64)
    off, on = both(eng, COPY_PROMPTS, max_tokens=40, temperature=0, ignore_eos=True)
    assert_identical(off, on)
    assert sum(o.meta["spec_accepted_tokens"] for o in on) > 0


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="speculative"):
        SamplingParams(speculative="yes")
    with pytest.raises(ValueError, match="speculative_max_draft must be"):
        Engine(speculative_max_draft=0)
    with pytest.raises(ValueError, match="speculative must be"):
        Engine(speculative=1)
