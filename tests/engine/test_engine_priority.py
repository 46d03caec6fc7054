"""Priorities and per-agent accounting on the real engine (embedded model): a high-priority
arrival preempts running low-priority requests, greedy outputs stay those of the HF oracle,
no page leaks, and the per-label totals add up."""

from __future__ import annotations

import threading
import time

import pytest

from agentlang.runtime import Engine, SamplingParams

pytestmark = pytest.mark.slow
N_NEW = 40


def greedy(n: int = N_NEW, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, **kw)


def test_priority_preemption_keeps_outputs_and_pages(model_path, oracle, prompt_ids):
    # urgent_slots=0: the batch is full, so the high arrival must preempt (not run above it)
    eng = Engine(model_path, page_size=16, kv_budget_mb=64, max_running=2, max_agent_labels=4,
                 urgent_slots=0)
    eng.start_background_loop()
    try:
        lows, hi_prompt = prompt_ids[:2], prompt_ids[2]
        outs: list = []
        worker = threading.Thread(target=lambda: outs.extend(
            eng.generate(lows, greedy(priority=0, agent="background"))))
        worker.start()
        deadline = time.monotonic() + 120
        while eng.metrics()["generated_tokens"] < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eng.metrics()["num_running"] == 2, "both low-priority requests should run"
        hi = eng.generate(hi_prompt, greedy(8, priority=5, agent="interactive"))
        worker.join(300)
        assert eng.metrics()["preemptions"] >= 1
        assert sum(o.meta["preemptions"] for o in outs) >= 1
        assert hi.meta["preemptions"] == 0
        # greedy outputs are the oracle's, preempted or not
        oracle.assert_same(hi_prompt, hi.outputs[0].token_ids,
                           list(oracle.continuation(tuple(hi_prompt), 8)), "high")
        for p, o in zip(lows, outs):
            oracle.assert_same(p, o.outputs[0].token_ids,
                               list(oracle.continuation(tuple(p), N_NEW)), "preempted low")
        # the high request finished before the low ones (it did not wait for a slot)
        assert hi.meta["latency_s"] < max(o.meta["latency_s"] for o in outs)
        stats = eng.agent_stats.snapshot()
        assert stats["background"]["requests"] == 2
        assert stats["background"]["generated_tokens"] == 2 * N_NEW
        assert stats["background"]["prompt_tokens"] == sum(len(p) for p in lows)
        assert stats["interactive"] == {
            "requests": 1, "prompt_tokens": len(hi_prompt), "generated_tokens": 8,
            "cached_tokens": hi.meta["cached_tokens"], "queue_s": pytest.approx(
                hi.meta["queue_s"])}
    finally:
        eng.shutdown()
    eng.flush_cache()
    assert eng.allocator.num_free == eng.allocator.num_pages
    eng.cache.check_integrity()


def highs_between_layers(eng: Engine, lows: list, his: list) -> tuple[list, list]:
    """Two low requests decoding on ``eng``'s background loop; high ones (``his``, 4 tokens
    each) submitted while they do, until two were served between layers. Returns the
    (prompt, output) pairs served and the lows' outputs; no preemption happened."""
    eng.start_background_loop()
    outs: list = []
    worker = threading.Thread(target=lambda: outs.extend(eng.generate(lows, greedy(priority=0))))
    worker.start()
    deadline = time.monotonic() + 120
    while eng.metrics()["generated_tokens"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    served = []
    for p in his:            # a submission lands mid-forward almost always: a few suffice
        if eng.metrics()["layer_break_steps"] >= 2 or not worker.is_alive():
            break
        time.sleep(0.02)     # metrics() held the step lock: let the next step start
        served.append((p, eng.generate(p, greedy(4, priority=3))))
    worker.join(300)
    assert eng.metrics()["layer_break_steps"] >= 1
    assert eng.metrics()["preemptions"] == 0
    return served, outs


def pages_all_back(eng: Engine) -> None:
    eng.flush_cache()
    assert eng.allocator.num_free == eng.allocator.num_pages
    eng.cache.check_integrity()


def test_high_arrivals_between_layers_keep_outputs_and_pages(model_path, oracle, prompt_ids):
    """High requests submitted while two low ones decode are served between the layers of
    the step in flight (above max_running, no preemption): every output is the oracle's."""
    eng = Engine(model_path, page_size=16, kv_budget_mb=64, max_running=2)
    lows = prompt_ids[:2]
    try:
        served, outs = highs_between_layers(eng, lows, prompt_ids[2:7])
        for p, o in served:
            oracle.assert_same(p, o.outputs[0].token_ids,
                               list(oracle.continuation(tuple(p), 4)), "served between layers")
        for p, o in zip(lows, outs):
            oracle.assert_same(p, o.outputs[0].token_ids,
                               list(oracle.continuation(tuple(p), N_NEW)), "paused low")
    finally:
        eng.shutdown()
    pages_all_back(eng)


def test_high_arrivals_between_native_layers_keep_outputs_and_pages(prompt_ids):
    """The same on the embedded GGUF, whose steps run every layer in one native call: the
    call stops between two layers only when an arrival is pending, the high requests are
    served there, and every output is what the request gives alone."""
    from agentlang.runtime.weights.model_loader import resolve_model

    eng = Engine(resolve_model("default", "auto").path, weights="auto", page_size=16,
                 kv_budget_mb=64, max_running=2)
    assert eng.model.native_decoder is not None
    lows = prompt_ids[:2]
    try:
        served, outs = highs_between_layers(eng, lows, prompt_ids[2:7])
        eng.flush_cache()
        for p, o in served:
            assert o.outputs[0].token_ids == eng.generate(p, greedy(4)).outputs[0].token_ids
        for p, o in zip(lows, outs):
            assert o.outputs[0].token_ids == eng.generate(p, greedy()).outputs[0].token_ids
    finally:
        eng.shutdown()
    pages_all_back(eng)
