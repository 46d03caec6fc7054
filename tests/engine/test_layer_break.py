"""Breaks between layers (``agentlang.runtime.engine.layer_break``), on the model-free step harness: a
higher-priority arrival taken while a step of lower-priority work is in flight is admitted and
gets its first token inside that step (above ``max_running`` by at most ``urgent_slots``,
never preempting); equal priorities never break a step; greedy outputs and pages unchanged."""

from __future__ import annotations

import random

from tests.support.step_harness import StepHarness, expected_tokens

PS = 4


def prompt(k: int, n: int = 12) -> list[int]:
    return [(k * 7) % 50 + 1] + [(k + i) % 50 + 1 for i in range(1, n)]


def busy(h: StepHarness, n: int, priority: int = 0, max_tokens: int = 10):
    """``n`` low requests, prefilled and decoding."""
    groups = [h.submit(prompt(i), max_tokens=max_tokens, ignore_eos=True, priority=priority)
              for i in range(n)]
    h.step()
    assert all(len(g.children[0].output_ids) == 1 for g in groups)
    return groups


def test_high_arrival_gets_its_first_token_inside_the_step_in_flight():
    h = StepHarness(page_size=PS, max_batch_tokens=64, max_running=4, urgent_slots=1)
    lows = busy(h, 4)
    hi = h.submit_mid_step(prompt(20, 9), max_tokens=3, ignore_eos=True, priority=5)
    n_steps = len(h.runner.steps)
    h.step()
    outer, brk = h.runner.steps[n_steps:]
    assert [it.req.group for it in brk] == [hi] and len(brk[0].tokens) == 9
    assert {it.req.group for it in outer} == set(lows)          # the step in flight: unchanged
    assert hi.children[0].output_ids == expected_tokens(hi.prompt_ids, 1)
    assert all(len(g.children[0].output_ids) == 2 for g in lows)
    assert len(h.scheduler.running) == 5 and h.scheduler.preemptions == 0
    assert h.breaks.steps == 1
    h.step()                                           # next step: everyone decodes together
    assert {it.req.group for it in h.runner.steps[-1]} == set(lows) | {hi}
    h.run()
    for g, n in [(g, 10) for g in lows] + [(hi, 3)]:
        assert g.children[0].output_ids == expected_tokens(g.prompt_ids, n)
    assert h.scheduler.preemptions == 0
    h.assert_no_leak()


def test_equal_priority_arrival_never_breaks_a_step():
    for prio in (0, 5):
        h = StepHarness(page_size=PS, max_batch_tokens=64, max_running=8)
        busy(h, 3, priority=prio)
        g = h.submit_mid_step(prompt(20), max_tokens=2, ignore_eos=True, priority=prio)
        n_steps = len(h.runner.steps)
        h.step()
        assert len(h.runner.steps) == n_steps + 1 and h.breaks.steps == 0
        assert g.children[0].output_ids == []            # admitted by the next step, as before
        h.step()
        assert len(g.children[0].output_ids) == 1
        h.run()
        h.assert_no_leak()


def test_urgent_slots_bound_the_running_count():
    """Three high arrivals while max_running is reached: urgent_slots of them are admitted
    between layers; the rest wait for the next step (which preempts for them as before)."""
    for slots in (0, 2):
        h = StepHarness(page_size=PS, max_batch_tokens=64, max_running=4, urgent_slots=slots)
        lows = busy(h, 4, max_tokens=6)
        his = [h.submit_mid_step(prompt(20 + k), max_tokens=2, ignore_eos=True, priority=3)
               for k in range(3)]
        h.step()
        assert sum(len(g.children[0].output_ids) for g in his) == slots
        assert len(h.scheduler.running) == 4 + slots and h.breaks.steps == min(slots, 1)
        h.run()
        for g, n in [(g, 6) for g in lows] + [(g, 2) for g in his]:
            assert g.children[0].output_ids == expected_tokens(g.prompt_ids, n)
        h.assert_no_leak()


def test_a_break_admits_only_what_outranks_the_step_in_flight():
    """A low request waits for a slot; a high one arrives mid-step: the break admits the high
    one only (above max_running), the low one keeps waiting (its rank is the step's floor)."""
    h = StepHarness(page_size=PS, max_batch_tokens=64, max_running=2, urgent_slots=2)
    busy(h, 2)
    low = h.submit(prompt(30), max_tokens=2, ignore_eos=True)
    hi = h.submit_mid_step(prompt(21), max_tokens=2, ignore_eos=True, priority=1)
    h.step()
    assert [it.req.group for it in h.runner.steps[-1]] == [hi]
    assert [r.group for r in h.scheduler.waiting] == [low]
    h.run()
    assert low.children[0].output_ids == expected_tokens(low.prompt_ids, 2)
    h.assert_no_leak()


def test_random_mid_step_arrivals_keep_outputs_and_pages():
    """Random priorities, mid-step arrivals, chunked prefill and a tiny pool (eviction, and
    preemption at the next steps): greedy tokens and pages as without breaks."""
    rng = random.Random(7)
    breaks = 0
    for _ in range(12):
        h = StepHarness(page_size=PS, num_pages=40, max_batch_tokens=16, max_running=4,
                        urgent_slots=rng.choice([0, 1, 3]))
        groups = []
        for k in range(14):
            ids = [rng.randint(1, 60) for _ in range(rng.randint(3, 24))]
            submit = h.submit_mid_step if rng.random() < 0.6 else h.submit
            groups.append(submit(ids, max_tokens=rng.randint(1, 8), ignore_eos=True,
                                 priority=rng.choice([0, 0, 2, 9])))
            if k % 2:
                h.step()
        h.run(3000)
        for g in groups:
            n = g.params.max_tokens
            assert g.error is None and g.children[0].output_ids == expected_tokens(
                g.prompt_ids, n)
        breaks += h.breaks.steps
        h.assert_no_leak()
    assert breaks > 0
