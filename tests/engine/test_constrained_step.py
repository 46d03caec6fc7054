"""The constrained-sampling step (:mod:`agentlang.runtime.engine.constrained_step`) and submit-time refusal of
constraints no output satisfies (:mod:`agentlang.runtime.grammar.satisfiable`).

Fast parts: the torch reference mask kernel against xgrammar's, the backend-neutral modules'
imports, the satisfiability checks, the batched step against the per-row reference
(:func:`verify_draft`), and a dead-end row failing alone. Slow part: bad constraints through
the engine on both backends (refused at submit, nothing queued, no page leak).
"""

from __future__ import annotations

import ast
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from tests.support.step_harness import EOS, VOCAB, StepHarness

from data.schemas import SCHEMAS
from agentlang.runtime.engine.constrained_step import ConstrainedStep, StepJob
from agentlang.runtime.engine.draft_verify import verify_draft
from agentlang.runtime.request.detokenizer import OutputText
from agentlang.runtime.core.errors import ErrorCode
from agentlang.runtime.grammar import constraint_from_params, make_grammar_backend
from agentlang.runtime.grammar.base import (CompiledGrammar, GrammarMatcher, bitmask_width,
                                  torch_bitmask_kernel)
from agentlang.runtime.grammar.jump_forward import draft_tokens
from agentlang.runtime.grammar.satisfiable import UnsatisfiableConstraint
from agentlang.runtime.grammar.vocab import TokenVocab
from agentlang.runtime.request.request import Request, RequestGroup
from agentlang.runtime.sampling.params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
V = 49152


# ---- the mask kernel and the neutral layer ------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [None, [0, 2]])
def test_torch_kernel_equals_xgrammar_kernel(dtype, rows):
    from agentlang.runtime.grammar.xgrammar_backend import xgrammar_bitmask_kernel

    g = torch.Generator().manual_seed(0)
    mask = torch.randint(-2**31, 2**31 - 1, (3, bitmask_width(V)), dtype=torch.int32, generator=g)
    logits = torch.randn(3, V, generator=g).to(dtype)
    ours, ref = logits.clone(), logits.clone()
    torch_bitmask_kernel(ours, mask, V, rows)
    xgrammar_bitmask_kernel(ref, mask, V, rows)
    assert torch.equal(ours, ref)
    assert torch.isinf(ours).any() and torch.isfinite(ours).any()


def _imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_backend_neutral_grammar_layer_imports_no_grammar_library():
    grammar = ROOT / "runtime" / "grammar"
    backends = {"xgrammar_backend.py", "outlines_backend.py"}
    for f in sorted(grammar.glob("*.py")):
        if f.name == "xgrammar_backend.py":
            continue
        names = _imports(f, module_level_only=False)
        assert not any(n.split(".")[0] == "xgrammar" for n in names), f.name
        if f.name not in backends:
            top = _imports(f, module_level_only=True)
            assert not any(n.split(".")[0] in ("xgrammar", "outlines_core") or
                           n.endswith("_backend") for n in top), (f.name, top)
    for f in (ROOT / "runtime" / "engine" / "constrained_step.py", ROOT / "runtime" / "sampling" / "sampler.py"):
        assert not any("xgrammar" in n or "outlines" in n for n in _imports(f, False)), f.name


# ---- satisfiability -----------------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    (dict(regex=r"[^\s\S]"), r"regex: /\[\^\\s\\S\]/ matches no string"),
    (dict(regex=r"ab[^\d\D]c|x[^\x00-\U0010ffff]"), "regex: .* matches no string"),
    (dict(regex=r"(?a)(q[^\w\W])+"), "regex: .* matches no string"),
    (dict(json_schema={"type": "array", "minItems": 3, "maxItems": 1}),
     "json_schema: minItems 3 > maxItems 1 at /:"),
    (dict(json_schema={"type": "object", "properties": {"t": {
        "type": "array", "items": {"type": "string", "minLength": 4, "maxLength": 1}}}}),
     "json_schema: minLength 4 > maxLength 1 at /properties/t/items:"),
    (dict(json_schema={"type": "string", "enum": ["abc", "de"], "pattern": "^[0-9]+$"}),
     "json_schema: no enum value satisfies"),
    (dict(json_schema={"const": 5, "type": "string"}), "json_schema: no const value"),
    (dict(json_schema={"type": "number", "exclusiveMinimum": 3, "maximum": 3}),
     "json_schema: exclusiveMinimum 3 and maximum 3 leave no number"),
    (dict(json_schema={"anyOf": [{"type": "object", "minProperties": 2, "maxProperties": 1}]}),
     "json_schema: minProperties 2 > maxProperties 1 at /anyOf/0:"),
    (dict(grammar='start: "a" | "b" x\nx: "b" x'), "grammar: rule x derives no finite text"),
    (dict(grammar='start: "a" X\nX: /[^\\s\\S]/'), "grammar: rule start derives no finite"),
    (dict(tool_calls=[{"name": "f", "parameters": {"type": "array", "minItems": 2,
                                                   "maxItems": 0}}]), "tool_calls: minItems"),
])
def test_unsatisfiable_constraints_are_refused_naming_the_field(kw, match):
    with pytest.raises(UnsatisfiableConstraint, match=match):
        constraint_from_params(**kw)
    with pytest.raises(ValueError, match=match):
        SamplingParams(max_tokens=8, **kw).constraint


@pytest.mark.parametrize("kw", [
    dict(regex="[éè]"), dict(regex=r"\\x"), dict(regex=r"([^\s\S])?x"), dict(regex=r"a|[^\w\W]"),
    dict(regex=r"^\d{3}$"), dict(regex=r"[^a]"), dict(regex=r"(?=a)a"),
    dict(json_schema={"type": "string", "enum": ["12", "ab"], "pattern": "^[0-9]+$"}),
    dict(json_schema={"not": {"type": "string", "minLength": 3, "maxLength": 1}}),
    dict(json_schema={"type": "integer", "minimum": 3, "maximum": 3}),
    dict(grammar='start: x\nx: "a" x | "b"'),
])
def test_satisfiable_constraints_pass(kw):
    assert constraint_from_params(**kw) is not None


def test_the_schema_set_is_consistent():
    for name, schema, _ in SCHEMAS:
        assert constraint_from_params(json_schema=schema) is not None, name


def test_duplicate_tool_names_are_refused():
    with pytest.raises(ValueError, match="tool_calls: item 1: duplicate tool name 'f'"):
        constraint_from_params(tool_calls=[{"name": "f"}, {"name": "f"}])


# ---- the step ---------------------------------------------------------------------------------
KEYS = {"type": "object", "properties": {"first_name": {"type": "string"},
                                         "last_name": {"type": "string"}},
        "required": ["first_name", "last_name"]}


def _request(tokenizer, params: SamplingParams, matcher=None, draft=(), seed=3) -> Request:
    group = RequestGroup("r", [1, 2, 3], params, ("t",))
    gen = torch.Generator().manual_seed(seed)
    return Request(group, 0, OutputText(tokenizer), gen, matcher, draft=list(draft))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_step_equals_the_per_row_reference(tokenizer, temperature):
    """ConstrainedStep.run (first rows batched, then the draft rows) draws the same tokens as
    verify_draft row by row with the plain sampler: the order the output processor used to
    sample in before the step was one module."""
    from agentlang.runtime.sampling.sampler import RowSpec, sample

    compiled = make_grammar_backend("xgrammar", tokenizer, V).compile(
        constraint_from_params(json_schema=KEYS))
    p = SamplingParams(max_tokens=40, temperature=temperature, complete_within_budget=False)
    draft = draft_tokens(compiled.new_matcher(), tokenizer)
    assert len(draft) >= 3
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(len(draft) + 3, V, generator=g)               # [k + 1 + 1 + 1, V]
    for i, t in enumerate(draft[:-1]):
        logits[i, t] += 30.0                                            # the model agrees...
    drafted = _request(tokenizer, p, compiled.new_matcher(), draft)
    plain = _request(tokenizer, p, compiled.new_matcher(), seed=4)
    free = _request(tokenizer, SamplingParams(max_tokens=4, temperature=temperature), seed=5)
    jobs = [StepJob(drafted, 0), StepJob(plain, len(draft) + 1), StepJob(free, len(draft) + 2)]
    got = ConstrainedStep(tokenizer, {EOS}, 4096).run(jobs, logits.clone())

    ref_m = compiled.new_matcher()
    ref_gen = torch.Generator().manual_seed(3)
    ref = verify_draft(ref_m, draft, logits[: len(draft) + 1].clone(), lambda i, row: sample(
        row.clone(), [RowSpec(p, ref_gen, [1, 2, 3], draft[:i])])[0][0])
    assert got[0].tokens == ref and len(ref) >= len(draft) - 1
    assert drafted.matcher.num_accepted == len(ref) == ref_m.num_accepted
    plain_ref = compiled.new_matcher()
    row = logits[len(draft) + 1 : len(draft) + 2].clone()
    verify = verify_draft(plain_ref, [], row, lambda i, r: sample(
        r.clone(), [RowSpec(p, torch.Generator().manual_seed(4), [1, 2, 3], [])])[0][0])
    assert got[1].tokens == verify and got[1].next_draft == draft_tokens(plain_ref, tokenizer)
    free_ref = sample(logits[len(draft) + 2 :].clone(),
                      [RowSpec(free.params, torch.Generator().manual_seed(5), [1, 2, 3], [])])[0]
    assert got[2].tokens == free_ref and got[2].next_draft == []


def test_unconstrained_rows_in_order_are_sampled_in_place_with_the_same_tokens(tokenizer):
    """The jobs are the logits' rows in order and none is constrained: the step penalizes
    and samples the model's logits themselves (an inference tensor) instead of a copy, and
    draws what the copy gives; a constrained job, a draft or a repeated row keeps the copy
    and leaves the raw rows as they were."""
    g = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        logits = torch.randn(3, V, generator=g)                          # as the runner's
    kinds = [SamplingParams(max_tokens=4, temperature=0.0, repetition_penalty=1.3, logprobs=2),
             SamplingParams(max_tokens=4, temperature=0.9, presence_penalty=0.7),
             SamplingParams(max_tokens=4, temperature=0.0)]

    def step(rows):
        jobs = [StepJob(_request(tokenizer, kinds[i % 3], seed=7 + i), r) for i, r in enumerate(rows)]
        return [(s.tokens, s.logprobs) for s in ConstrainedStep(tokenizer, {EOS}, 4096).run(jobs, x)]

    x = logits.clone()
    copied = step([0, 1, 0])                      # a repeated row: the copy, raw rows untouched
    assert torch.equal(x, logits)
    x = logits.clone()
    in_place = step([0, 1, 2])
    assert not torch.equal(x, logits)             # penalties applied on the logits themselves
    x = logits.clone()
    assert step([0, 1]) == in_place[:2] and copied[:2] == in_place[:2]
    compiled = make_grammar_backend("xgrammar", tokenizer, V).compile(
        constraint_from_params(json_schema=KEYS))
    x = logits.clone()
    jobs = [StepJob(_request(tokenizer, kinds[2], compiled.new_matcher()), 0),
            StepJob(_request(tokenizer, kinds[0]), 1), StepJob(_request(tokenizer, kinds[1]), 2)]
    ConstrainedStep(tokenizer, {EOS}, 4096).run(jobs, x)
    assert torch.equal(x, logits)                 # constrained: the raw rows stay


class _DeadEnd(GrammarMatcher):
    """Allows no token at all (a constraint with a dead end no submit check caught)."""

    def __init__(self, vocab: TokenVocab):
        self.vocab = vocab

    def fill_mask(self, bitmask, row):
        bitmask[row].zero_()

    def accept_token(self, token_id):
        return False

    def is_terminated(self):
        return False

    def jump_forward_text(self):
        return ""

    def rollback(self, num_tokens):
        if num_tokens:
            raise ValueError("num_tokens: nothing to roll back")

    @property
    def num_accepted(self):
        return 0

    def can_end(self):
        return False

    def state_key(self):
        return 0


class _DeadCompiled(CompiledGrammar):
    def __init__(self):
        self.vocab = TokenVocab((b"x",) * VOCAB, frozenset(), (EOS,), VOCAB, "dead")

    def new_matcher(self):
        return _DeadEnd(self.vocab)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_with_no_allowed_token_fails_alone(temperature):
    h = StepHarness()
    ok = h.submit([1, 2, 3], max_tokens=4)
    dead = h.builder.group([1, 2, 3], SamplingParams(max_tokens=4, temperature=temperature,
                                                     complete_within_budget=False))
    dead.grammar = Future()
    dead.grammar.set_result(_DeadCompiled())
    h.processor.add(dead)
    h.run()
    out = dead.output()
    assert out.finish_reason == "abort" and out.outputs[0].token_ids == []
    assert out.error.code == ErrorCode.INVALID_CONSTRAINT and "no token" in out.error.message
    assert ok.output().error is None and len(ok.output().outputs[0].token_ids) == 4
    h.assert_no_leak()


# ---- through the engine -------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["xgrammar", "outlines"])
def eng(request, model_path):
    from agentlang.runtime import Engine

    return Engine(model_path, page_size=16, kv_budget_mb=64, grammar_backend=request.param)


@pytest.mark.slow
@pytest.mark.parametrize("kw, field", [
    (dict(regex=r"ab[^\s\S]c"), "regex"),
    (dict(json_schema={"type": "array", "items": {"type": "integer"}, "minItems": 3,
                       "maxItems": 1}), "json_schema"),
    (dict(json_schema={"type": "object", "properties": {"code": {
        "type": "string", "enum": ["abc"], "pattern": "^[0-9]+$"}}}), "json_schema"),
    (dict(grammar='start: "ab" x\nx: "c" x'), "grammar"),
    (dict(tool_calls=[{"name": "f"}, {"name": "f"}]), "tool_calls"),
])
@pytest.mark.parametrize("complete_within_budget", [True, False])
def test_unsatisfiable_constraints_refused_at_submit(eng, kw, field, complete_within_budget):
    with pytest.raises(ValueError, match=f"^{field}: "):
        eng.generate("x", SamplingParams(max_tokens=8,
                                         complete_within_budget=complete_within_budget, **kw))
    assert eng.tracker.rids() == [] and not eng.scheduler.has_work     # nothing queued
    eng.flush_cache()
    assert eng.allocator.num_free == eng.allocator.num_pages            # nothing leaked
    out = eng.generate("Pick one: ", SamplingParams(max_tokens=8, regex="[éè]", temperature=0))
    assert out.error is None and out.text in ("é", "è")                 # and it still serves
