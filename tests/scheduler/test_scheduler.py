"""Scheduler unit tests on the model-free step harness: cache-aware admission, the
``max_wait_steps`` fairness bound, ``min_shared_prefix`` waiting, chunked prefill,
preemption, requests that cannot fit, and one prefix match per admission."""

from __future__ import annotations

import pytest

from agentlang.runtime.core.errors import UNFIT_IN_KV_POOL, ErrorCode
from tests.support.step_harness import StepHarness, expected_tokens

PS = 4


def warm(h: StepHarness, prompt: list[int]) -> None:
    h.submit(prompt, max_tokens=1)
    h.run()


def test_longest_cached_prefix_is_admitted_first():
    h = StepHarness(page_size=PS, max_running=1)
    hot = list(range(1, 17))
    warm(h, hot + [30])
    cold = h.submit([40, 41, 42, 43, 44], max_tokens=1)
    cached = h.submit(hot + [31], max_tokens=1)
    h.step()                                        # the one slot goes to the cached one
    assert cached.children[0].finish_reason == "length"
    assert cold.children[0].finish_reason is None and cold.children[0].admit_seq == -1
    h.run()
    assert cached.cached_tokens == 16 and cold.cached_tokens == 0
    h.assert_no_leak()


def _steps_until_admitted(max_wait_steps: int, limit: int = 40) -> int | None:
    """One slot; a cold request waits while requests with a cached prefix keep arriving.
    Returns the step at which the cold one was admitted (None: not within ``limit``)."""
    h = StepHarness(page_size=PS, max_running=1, max_wait_steps=max_wait_steps)
    hot = list(range(1, 17))
    warm(h, hot + [30])
    h.submit(hot + [31], max_tokens=2)
    cold = h.submit([40, 41, 42, 43, 44], max_tokens=1)
    for step in range(1, limit + 1):
        if len(h.scheduler.waiting) < 2:           # always one hot request queued
            h.submit(hot + [32 + step % 8], max_tokens=2)
        h.step()
        if cold.children[0].admit_seq >= 0:
            return step
    return None


def test_max_wait_steps_bounds_waiting_behind_cached_prefixes():
    assert _steps_until_admitted(max_wait_steps=10**6) is None   # cache-aware order starves it
    admitted = _steps_until_admitted(max_wait_steps=5)
    # it waits 5 steps, then goes first as soon as the slot is free (a hot one runs 2 steps)
    assert admitted is not None and 5 <= admitted <= 5 + 2


def test_min_shared_prefix_waits_one_step_and_matches_from_cache():
    shared = list(range(1, 41))                     # 40 tokens: 10 pages of 4
    h = StepHarness(page_size=PS, min_shared_prefix=32)
    a = h.submit(shared + [50, 51], max_tokens=2)
    b = h.submit(shared + [52, 53], max_tokens=2)
    h.step()
    assert a.children[0].admit_seq >= 0 and b.children[0].admit_seq == -1   # b waits
    h.step()
    assert b.children[0].admit_seq >= 0
    h.run()
    assert b.cached_tokens == 40                    # the shared prefix was computed once
    assert b.output().outputs[0].token_ids == expected_tokens(shared + [52, 53], 2)
    h.assert_no_leak()


@pytest.mark.parametrize("overlap,min_shared", [(40, 10**6), (8, 32)])
def test_small_or_ignored_overlap_admits_together(overlap, min_shared):
    shared = list(range(1, overlap + 1))
    h = StepHarness(page_size=PS, min_shared_prefix=min_shared)
    a = h.submit(shared + [50, 51], max_tokens=2)
    b = h.submit(shared + [52, 53], max_tokens=2)
    h.step()
    assert a.children[0].admit_seq >= 0 and b.children[0].admit_seq >= 0
    h.run()
    assert b.cached_tokens == 0
    h.assert_no_leak()


def test_chunked_prefill_respects_the_token_budget():
    h = StepHarness(page_size=PS, max_batch_tokens=8)
    prompt = list(range(1, 21))
    g = h.submit(prompt, max_tokens=3)
    h.run()
    sizes = [sum(len(it.tokens) for it in step) for step in h.runner.steps]
    assert max(sizes) <= 8 and sizes[:3] == [8, 8, 4]
    assert g.output().outputs[0].token_ids == expected_tokens(prompt, 3)
    h.assert_no_leak()


def test_preemption_under_page_pressure_keeps_outputs():
    prompts = [[i * 5 + j for j in range(1, 9)] for i in range(4)]
    big = StepHarness(page_size=PS, num_pages=256)
    small = StepHarness(page_size=PS, num_pages=14)
    outs = []
    for h in (big, small):
        groups = [h.submit(p, max_tokens=12, ignore_eos=True) for p in prompts]
        h.run()
        outs.append([g.output().outputs[0].token_ids for g in groups])
        h.assert_no_leak()
    assert small.scheduler.preemptions > 0 and big.scheduler.preemptions == 0
    assert outs[0] == outs[1] == [expected_tokens(p, 12) for p in prompts]


def test_request_that_cannot_fit_alone_ends_with_length():
    h = StepHarness(page_size=PS, num_pages=3)       # 12 tokens in all
    g = h.submit(list(range(1, 9)), max_tokens=20, ignore_eos=True)
    h.run()
    out = g.output()
    assert out.outputs[0].finish_reason == "length"
    assert out.error == UNFIT_IN_KV_POOL and out.error.code is ErrorCode.KV_POOL_EXCEEDED
    h.assert_no_leak()


def test_one_prefix_match_per_admission(monkeypatch):
    h = StepHarness(page_size=PS)
    warm(h, list(range(1, 17)) + [30])
    calls = []
    real = h.cache.match_prefix

    def counting(tokens, namespace=(), *, record=True):
        calls.append(tuple(tokens))
        return real(tokens, namespace, record=record)

    monkeypatch.setattr(h.cache, "match_prefix", counting)
    groups = [h.submit(list(range(1, 17)) + [40 + i], max_tokens=1) for i in range(3)]
    h.step()
    admitted = [tuple(g.prompt_ids) for g in groups]
    assert sorted(calls) == sorted(admitted)          # one match each, none repeated
