"""Speculation on the model-free step harness: drafts copied from the context are verified in
one step, outputs equal speculation off (greedy, seeded sampling, logprobs, n > 1, stops,
max_tokens, preemption), rejected tokens leave no KV page and no tree entry, counters."""

from __future__ import annotations

import torch

from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.speculative import DraftPolicy
from tests.support.step_harness import StepHarness as _Harness
from tests.support.step_harness import expected_tokens

POLICY = DraftPolicy(max_draft=8, row_cost=0.15)    # fixed here: the default is a measurement


def StepHarness(**kw):                              # noqa: N802 (the harness, this policy)
    return _Harness(policy=POLICY, **kw)

# The fake model continues t -> t + 1. After the prompt's last token (2) it says 3, 4, ...;
# the context's earlier copy of (1, 2, 3) continues 4 .. 12, then 1: a draft of 9 kept tokens
# and one rejected.
COPY = list(range(1, 13)) + [1, 2]
# (5, 6) occurs earlier followed by 7, 8, 9: kept; then the copy of (5 .. 9) goes on with 5,
# rejected (the model says 10).
PARTIAL = [5, 6, 7, 8, 9, 5, 6]
# After 6 the model says 7; the copy of (5, 6, 7) goes on with 9: rejected at once (8).
REJECT = [5, 6, 7, 9, 30, 5, 6]


def run(prompts, engine_default, harness=None, **params):
    h = harness or StepHarness(speculative=engine_default)
    groups = [h.submit(p, **params) for p in prompts]
    h.run()
    h.assert_no_leak()
    return h, groups


def tokens(groups):
    return [[c.token_ids for c in g.output().outputs] for g in groups]


def test_drafts_keep_outputs_and_save_passes():
    prompts = [COPY, PARTIAL]
    off, g_off = run(prompts, False, max_tokens=20, ignore_eos=True)
    on, g_on = run(prompts, True, max_tokens=20, ignore_eos=True)
    assert tokens(g_on) == tokens(g_off) == [[expected_tokens(p, 20)] for p in prompts]
    assert on.runner.forward_passes < off.runner.forward_passes
    meta = g_on[0].output().meta
    # 10 of the copy's tokens are right; a batch of two drafts shorter than one request would
    assert meta["spec_draft_tokens"] >= meta["spec_accepted_tokens"] >= 6
    partial = g_on[1].output().meta                        # a draft was rejected
    assert partial["spec_draft_tokens"] > partial["spec_accepted_tokens"] >= 1
    assert meta["spec_verify_ct"] >= 1
    c = on.tracker.counters
    assert c.spec_draft_tokens == sum(g.output().meta["spec_draft_tokens"] for g in g_on)
    assert c.spec_accepted_tokens == sum(g.output().meta["spec_accepted_tokens"] for g in g_on)
    assert off.tracker.counters.spec_draft_tokens == 0
    assert g_off[0].output().meta["spec_draft_tokens"] == 0


def test_the_request_field_overrides_the_engine_default():
    h_on, g = run([COPY], True, max_tokens=12, ignore_eos=True, speculative=False)
    assert g[0].output().meta["spec_draft_tokens"] == 0
    h_off, g = run([COPY], False, max_tokens=12, ignore_eos=True, speculative=True)
    assert g[0].output().meta["spec_draft_tokens"] > 0


def test_rejected_tokens_are_rolled_back_every_step():
    """After each step a running request's pages and table hold exactly its computed tokens
    (the kept draft plus its prefix), never a rejected one; the radix tree only ever holds
    prefixes of prompt + output."""
    h = StepHarness(speculative=True)
    g = h.submit(REJECT, max_tokens=12, ignore_eos=True)
    ps = h.cache.page_size
    saw_draft = False
    while h.step():
        for req in h.scheduler.running:
            saw_draft |= bool(req.draft)
            assert req.page_table.num_tokens == req.num_computed == req.num_tokens - 1
            assert len(req.page_table.pages) == -(-req.num_computed // ps)
    assert saw_draft
    meta = g.output().meta
    assert meta["spec_draft_tokens"] > meta["spec_accepted_tokens"]
    out = g.output().outputs[0].token_ids
    assert out == expected_tokens(REJECT, 12)
    seq = REJECT + out
    for ids in _tree_paths(h.cache):
        assert ids == seq[:len(ids)]
    h.assert_no_leak()


def _tree_paths(cache):
    """The token ids from the root to every node of the radix tree."""
    out, stack = [], [(root, []) for root in cache.roots().values()]
    while stack:
        node, ids = stack.pop()
        for child in node.children.values():
            path = ids + list(child.key)
            out.append(path)
            stack.append((child, path))
    return out


def test_stops_and_max_tokens_inside_a_draft():
    # the draft 4 .. 12 runs past the stop token 6 and past max_tokens 5
    _, (by_id,) = run([COPY], True, max_tokens=20, stop_token_ids=[6])
    assert by_id.output().outputs[0].token_ids == [3, 4, 5, 6]
    _, (short,) = run([COPY], True, max_tokens=5, ignore_eos=True)
    assert short.output().outputs[0].token_ids == [3, 4, 5, 6, 7]
    _, (text,) = run([COPY], True, max_tokens=20, stop=["gh"])    # tokens 6, 7 spell "gh"
    assert text.output().outputs[0].text == "def"


def test_logprobs_and_seeded_sampling_and_n_are_unchanged():
    # temperature 0.7 over the fake logits (10 vs -10) is near-deterministic but goes through
    # each request's seeded generator, row by row
    params = dict(max_tokens=16, ignore_eos=True, logprobs=2, temperature=0.7, seed=3, n=2)
    outs = []
    for spec in (False, True):
        h = StepHarness(speculative=spec)
        g = h.builder.group(list(COPY), SamplingParams(**params))
        h.processor.add(g)
        h.run()
        h.assert_no_leak()
        outs.append(g.output())
    off, on = outs
    assert on.meta["spec_draft_tokens"] > 0
    for a, b in zip(off.outputs, on.outputs):
        assert a.token_ids == b.token_ids
        assert len(b.logprobs) == len(b.token_ids)
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.token_id == y.token_id and x.top == y.top
            assert torch.isclose(torch.tensor(x.logprob), torch.tensor(y.logprob))


def test_greedy_draft_rows_at_once_keep_penalties_bans_and_logprobs():
    """A greedy unconstrained request's draft rows are sampled together; each row still gets
    its own draft prefix's penalties, min_tokens' ban and logprobs: as off. The model says 11
    after 10, banned while the output is under 16 tokens: that row, inside a long draft by
    then, picks another token (rows sampled without their ban would keep the draft's 11)."""
    params = dict(max_tokens=20, ignore_eos=True, logprobs=2, repetition_penalty=1.3,
                  frequency_penalty=2.0, min_tokens=16, stop_token_ids=[11])  # greedy (harness)
    outs = []
    for spec in (False, True):
        h, (g,) = run([list(COPY)], spec, **params)
        outs.append(g.output())
    off, on = outs
    assert on.meta["spec_draft_tokens"] > 0 and on.meta["spec_accepted_tokens"] > 0
    a, b = off.outputs[0], on.outputs[0]
    assert a.token_ids == b.token_ids
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        assert x.token_id == y.token_id and x.top == y.top
        assert torch.isclose(torch.tensor(x.logprob), torch.tensor(y.logprob))


def test_preemption_with_drafts_keeps_outputs():
    prompts = [[i * 10 + j for j in range(1, 9)] + [i * 10 + 1, i * 10 + 2] for i in range(4)]
    small = StepHarness(page_size=4, num_pages=14, speculative=True)
    _, groups = run(prompts, True, harness=small, max_tokens=12, ignore_eos=True)
    assert small.scheduler.preemptions > 0
    assert small.tracker.counters.spec_draft_tokens > 0
    assert tokens(groups) == [[expected_tokens(p, 12)] for p in prompts]
