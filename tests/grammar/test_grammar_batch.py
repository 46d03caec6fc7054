"""Batch masking, the compiled-grammar cache and jump-forward helpers (no model forward)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from agentlang.runtime.grammar import (
    GrammarCache,
    apply_grammar_masks,
    bitmask_width,
    constraint_from_params,
    jump_forward,
    make_grammar_backend,
)
from agentlang.runtime.grammar.base import CompiledGrammar, GrammarBackend
from agentlang.runtime.engine.draft_verify import verify_draft
from agentlang.runtime.grammar.jump_forward import draft_tokens

V = 49152
KEY_HEAVY = {
    "type": "object",
    "properties": {k: {"type": "string"} for k in ["first_name", "last_name", "home_city"]},
    "required": ["first_name", "last_name", "home_city"],
}


@pytest.fixture(scope="module")
def backend(tokenizer):
    return make_grammar_backend("xgrammar", tokenizer, V)


@pytest.fixture(scope="module")
def compiled(backend):
    return backend.compile(constraint_from_params(json_schema=KEY_HEAVY))


def test_masks_only_touch_constrained_rows(compiled, tokenizer):
    logits = torch.randn(4, V)
    before = logits.clone()
    a, b = compiled.new_matcher(), compiled.new_matcher()
    assert b.accept_token(tokenizer.encode("{", add_special_tokens=False)[0])
    apply_grammar_masks(logits, [a, None, b, None])
    assert torch.equal(logits[1], before[1]) and torch.equal(logits[3], before[3])
    for row, m in [(0, a), (2, b)]:
        allowed = m.allowed_token_ids()
        finite = torch.isfinite(logits[row]).nonzero().flatten().tolist()
        assert finite == allowed
        assert torch.equal(logits[row, allowed], before[row, allowed])


def test_all_rows_constrained_and_reused_buffer(compiled):
    logits = torch.randn(2, V, dtype=torch.bfloat16)
    buffer = torch.zeros(8, bitmask_width(V), dtype=torch.int32)
    ms = [compiled.new_matcher(), compiled.new_matcher()]
    apply_grammar_masks(logits, ms, bitmask=buffer)
    allowed = ms[0].allowed_token_ids()
    for row in range(2):
        assert torch.isfinite(logits[row]).nonzero().flatten().tolist() == allowed


def test_unconstrained_batch_allocates_nothing(monkeypatch):
    logits = torch.randn(3, V)
    before = logits.clone()

    def no_alloc(*args, **kwargs):
        raise AssertionError("allocated a bitmask for an unconstrained batch")

    monkeypatch.setattr(torch, "empty", no_alloc)
    apply_grammar_masks(logits, [None, None, None])
    assert torch.equal(logits, before)


def test_mask_shape_errors(compiled):
    with pytest.raises(ValueError, match="N == len"):
        apply_grammar_masks(torch.randn(2, V), [compiled.new_matcher()])
    with pytest.raises(ValueError, match="vocab_size"):
        apply_grammar_masks(torch.randn(1, V - 32), [compiled.new_matcher()])
    with pytest.raises(ValueError, match="bitmask must be int32"):
        apply_grammar_masks(torch.randn(1, V), [compiled.new_matcher()],
                            bitmask=torch.zeros(1, 7, dtype=torch.int32))


class GatedBackend(GrammarBackend):
    """A backend whose compile blocks until released; counts compilations."""

    name = "gated"

    def __init__(self, vocab):
        self.vocab = vocab
        self.gate = threading.Event()
        self.calls = 0

    def compile(self, constraint) -> CompiledGrammar:
        self.calls += 1
        if constraint.kind == "regex" and constraint.spec == "bad":
            raise ValueError("regex: refused by the gated backend")
        if constraint.kind == "regex" and constraint.spec == "boom":
            raise RuntimeError("transient failure")
        assert self.gate.wait(10)
        return ("compiled", constraint)  # type: ignore[return-value]


def test_cache_compiles_off_the_caller_thread(backend):
    gated = GatedBackend(backend.vocab)
    with GrammarCache(gated, max_workers=2) as cache:
        c = constraint_from_params(regex="[a-z]+")
        start = time.perf_counter()
        fut = cache.submit(c)
        assert time.perf_counter() - start < 0.5 and not fut.done()  # submit never blocks
        assert cache.submit(constraint_from_params(regex="[a-z]+")) is fut  # in flight: shared
        gated.gate.set()
        assert cache.get(c, timeout=10) == ("compiled", c)
        assert gated.calls == 1 and cache.hits == 2 and cache.misses == 1


def test_cache_keeps_value_errors_and_forgets_other_failures(backend):
    gated = GatedBackend(backend.vocab)
    gated.gate.set()
    with GrammarCache(gated) as cache:
        bad = constraint_from_params(regex="bad")
        with pytest.raises(ValueError, match="regex: refused"):
            cache.get(bad, timeout=10)
        with pytest.raises(ValueError):
            cache.get(bad, timeout=10)
        assert gated.calls == 1
        boom = constraint_from_params(regex="boom")
        with pytest.raises(RuntimeError):
            cache.get(boom, timeout=10)
        with pytest.raises(RuntimeError):
            cache.get(boom, timeout=10)
        assert gated.calls == 3


def test_cache_evicts_least_recently_used(backend):
    gated = GatedBackend(backend.vocab)
    gated.gate.set()
    with GrammarCache(gated, max_entries=2) as cache:
        a, b, c = (constraint_from_params(regex=r) for r in ["a", "b", "c"])
        cache.get(a), cache.get(b), cache.get(a), cache.get(c)  # b is the LRU entry
        assert len(cache) == 2 and gated.calls == 3
        cache.get(a)
        assert gated.calls == 3
        cache.get(b)
        assert gated.calls == 4


def test_cache_key_includes_backend_and_vocab(backend, tokenizer):
    c = constraint_from_params(choices=["x"])
    other = make_grammar_backend("xgrammar", tokenizer, V, stop_token_ids=[0, 2])
    with GrammarCache(backend) as one, GrammarCache(other) as two:
        assert one.key(c) != two.key(c) and one.key(c)[2] == c


def test_real_backend_through_cache(backend, tokenizer):
    with GrammarCache(backend) as cache:
        compiled = cache.get(constraint_from_params(json_schema=KEY_HEAVY), timeout=30)
        assert compiled.new_matcher().jump_forward_text() == '{"first_name":"'
        with pytest.raises(ValueError, match="json_schema: keyword 'uniqueItems'"):
            cache.get(constraint_from_params(json_schema={"type": "array", "uniqueItems": True}))


def test_forced_jump_forward_retokenizes_the_boundary(compiled, tokenizer):
    m = compiled.new_matcher()
    out = tokenizer.encode("{", add_special_tokens=False)  # the model chose "{" (not '{"')
    assert m.accept_token(out[0])
    jf = jump_forward(m, tokenizer, out)
    assert jf.text == '"first_name":"'
    assert jf.rollback == 1 and jf.token_ids == tokenizer.encode('{"first_name":"',
                                                                  add_special_tokens=False)
    assert m.num_accepted == len(jf.token_ids)
    out = out[: len(out) - jf.rollback] + jf.token_ids
    assert tokenizer.decode(out) == '{"first_name":"'
    for t in tokenizer.encode('Ann","last_name":"', add_special_tokens=False):
        assert m.accept_token(t)
    assert jump_forward(m, tokenizer, out) is None  # inside a free string nothing is forced


def test_verify_draft_keeps_the_model_choices(compiled, tokenizer):
    m = compiled.new_matcher()
    draft = draft_tokens(m, tokenizer)
    assert tokenizer.decode(draft) == '{"first_name":"'
    quote = tokenizer.encode('{', add_special_tokens=False)[0]
    logits = torch.zeros(len(draft) + 1, V)
    logits[0, draft[0]] = 5.0       # the model agrees with draft[0]...
    logits[1, draft[1]] = 5.0       # ...and draft[1]...
    logits[2, quote] = 9.0          # ...then prefers a token outside the grammar (masked)...
    logits[2, draft[2]] = 1.0       # ...so the grammar-valid best choice is draft[2] again
    probe = compiled.new_matcher()
    assert all(probe.accept_token(t) for t in draft[:3])
    alternative = next(t for t in probe.allowed_token_ids() if t != draft[3])
    logits[3, draft[3]] = 2.0
    logits[3, alternative] = 3.0    # row 3: the model prefers another valid token: stop there
    seen = []

    def greedy(i, row):
        seen.append(i)
        return int(row.argmax(-1))

    out = verify_draft(m, draft, logits.clone(), greedy)
    assert out == draft[:3] + [alternative] and seen == [0, 1, 2, 3]
    assert m.num_accepted == 4
    with pytest.raises(ValueError, match="logits must be"):
        verify_draft(compiled.new_matcher(), draft, logits[:2], greedy)
    with pytest.raises(ValueError, match="forbids"):
        verify_draft(compiled.new_matcher(), draft, logits.clone(), lambda i, row: quote + 1000)


def test_verify_draft_without_draft_is_one_decode_step(compiled):
    m = compiled.new_matcher()
    logits = torch.randn(1, V)
    out = verify_draft(m, [], logits, lambda i, row: int(row.argmax(-1)))
    assert len(out) == 1 and m.num_accepted == 1


def test_concurrent_compiles_on_both_backends(tokenizer):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "grammar_schemas", Path(__file__).parents[1] / "data" / "schemas.py")
    schemas = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(schemas)
    for name in ("xgrammar", "outlines"):
        backend = make_grammar_backend(name, tokenizer, V)
        with GrammarCache(backend, max_workers=4) as cache:
            jobs = [(instance, cache.submit(constraint_from_params(json_schema=schema)))
                    for sname, schema, instance in schemas.SCHEMAS
                    if name == "xgrammar" or sname not in schemas.OUTLINES_UNSUPPORTED]
            for instance, fut in jobs:
                m = fut.result(timeout=60).new_matcher()
                assert all(m.accept_token(t)
                           for t in tokenizer.encode(instance, add_special_tokens=False))
                assert m.is_terminated()


def test_split_fill_then_apply(compiled):
    from agentlang.runtime.grammar import apply_grammar_bitmask, fill_grammar_bitmask

    assert fill_grammar_bitmask([None, None], V) is None
    apply_grammar_bitmask(torch.randn(2, V), None)  # no-op
    m = compiled.new_matcher()
    filled = fill_grammar_bitmask([None, m], V)
    assert filled.rows == [1] and filled.batch == 2
    logits = torch.randn(2, V)
    before = logits.clone()
    apply_grammar_bitmask(logits, filled)
    assert torch.equal(logits[0], before[0])
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == m.allowed_token_ids()
    with pytest.raises(ValueError, match="logits must be"):
        apply_grammar_bitmask(torch.randn(3, V), filled)


@pytest.mark.parametrize("V", [49152, 1000, 37])
def test_native_bitmask_kernel_matches_the_reference(native_lib, V):
    """sample.c's mask kernel against the plain-torch reference and xgrammar's CPU kernel: every
    row or some rows, logits wider than the vocabulary (the tail left alone), masks with all,
    none and random bits allowed."""
    import xgrammar as xgr

    from agentlang.runtime.grammar.base import torch_bitmask_kernel

    g = torch.Generator().manual_seed(V)
    W = (V + 31) // 32
    mask = torch.randint(-2 ** 31, 2 ** 31 - 1, (4, W), dtype=torch.int32, generator=g)
    mask[1] = -1                                                    # everything allowed
    mask[2] = 0                                                     # nothing allowed
    logits = torch.randn(4, V + 7, generator=g)
    for rows in (None, [0, 2, 3]):
        ref, ours, theirs = logits.clone(), logits.clone(), logits.clone()
        torch_bitmask_kernel(ref, mask, V, rows)
        native_lib.apply_bitmask(ours, mask, V, rows)
        xgr.apply_token_bitmask_inplace(theirs, mask, vocab_size=V, indices=rows)
        assert torch.equal(ours, ref) and torch.equal(theirs, ref)
        assert torch.equal(ours[:, V:], logits[:, V:])
    with pytest.raises(ValueError, match="int32"):
        native_lib.apply_bitmask(logits.to(torch.bfloat16), mask, V, None)
