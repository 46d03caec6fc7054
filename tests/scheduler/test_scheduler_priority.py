"""Priorities in the scheduler, on the model-free step harness: admission order, the
low-values-first direction, preemption by priority for a batch slot and for KV pages (pages
freed, reused, nothing leaked), equal priorities never preempt, the aging bound against a
stream of higher-priority arrivals, greedy outputs unchanged, per-label totals, urgent steps
(a high-priority prefill is not held behind lower-priority chunks and shares its step with at
most ``max_lower_priority_tokens`` lower-priority tokens; lower priorities keep progressing)."""

from __future__ import annotations

from tests.support.step_harness import StepHarness, expected_tokens

PS = 4


def prompt(k: int, n: int = 12) -> list[int]:
    return [(k * 7) % 50 + 1] + [(k + i) % 50 + 1 for i in range(1, n)]


def admitted_order(groups) -> list[int]:
    """Indexes of ``groups`` by first admission."""
    return sorted(range(len(groups)), key=lambda i: groups[i].admit_time)


def test_admission_orders_by_priority_then_arrival():
    h = StepHarness(page_size=PS, max_running=1)
    prios = [0, 3, -1, 3, 10]
    groups = [h.submit(prompt(i), max_tokens=2, priority=p) for i, p in enumerate(prios)]
    h.run()
    assert admitted_order(groups) == [4, 1, 3, 0, 2]     # FIFO among the two 3s
    h.assert_no_leak()


def test_low_values_first_direction():
    h = StepHarness(page_size=PS, max_running=1, low_priority_values_first=True)
    groups = [h.submit(prompt(i), max_tokens=2, priority=p) for i, p in enumerate([0, 3, -1])]
    h.run()
    assert admitted_order(groups) == [2, 0, 1]
    h.assert_no_leak()


def low_and_mid_running(urgent_slots: int):
    """A full batch (max_running 2) of a priority-0 and a priority-1 request, 3 steps in."""
    h = StepHarness(page_size=PS, max_running=2, urgent_slots=urgent_slots)
    bg = [h.submit(prompt(i), max_tokens=30, ignore_eos=True, priority=p)
          for i, p in enumerate([0, 1])]
    for _ in range(3):
        h.step()
    low, mid = (g.children[0] for g in bg)
    assert low in h.scheduler.running and mid in h.scheduler.running
    return h, bg, low, mid


def test_higher_arrival_preempts_the_lowest_running_for_a_slot():
    h, bg, low, mid = low_and_mid_running(urgent_slots=0)
    hi = h.submit(prompt(9), max_tokens=3, ignore_eos=True, priority=5)
    h.step()
    assert hi.children[0] in h.scheduler.running
    assert low.preemptions == 1 and low not in h.scheduler.running    # the lowest priority
    assert mid.preemptions == 0 and h.scheduler.preemptions == 1
    h.run()
    assert hi.finish_time < bg[0].finish_time
    for g, n in ((bg[0], 30), (bg[1], 30), (hi, 3)):    # greedy outputs unchanged
        assert g.children[0].output_ids == expected_tokens(g.prompt_ids, n)
    h.assert_no_leak()


def test_higher_arrivals_take_urgent_slots_before_preempting():
    """Between steps as between layers: an arrival that outranks a running request runs in
    one of ``urgent_slots`` slots above ``max_running``; the next one, with those taken,
    preempts the lowest. An arrival outranking no running request never uses them."""
    h, bg, low, mid = low_and_mid_running(urgent_slots=1)
    same = h.submit(prompt(7), max_tokens=3, ignore_eos=True, priority=0)
    h.step()
    assert same.admit_time is None and len(h.scheduler.running) == 2
    hi = h.submit(prompt(8), max_tokens=20, ignore_eos=True, priority=5)
    h.step()
    assert hi.children[0] in h.scheduler.running and len(h.scheduler.running) == 3
    assert h.scheduler.preemptions == 0
    hi2 = h.submit(prompt(9), max_tokens=3, ignore_eos=True, priority=5)
    h.step()
    assert hi2.children[0] in h.scheduler.running and len(h.scheduler.running) == 3
    assert low.preemptions == 1 and mid.preemptions == 0 and h.scheduler.preemptions == 1
    assert same.admit_time is None                    # the batch is still over max_running
    h.run()
    for g, n in ((bg[0], 30), (bg[1], 30), (same, 3), (hi, 20), (hi2, 3)):
        assert g.children[0].output_ids == expected_tokens(g.prompt_ids, n)
    h.assert_no_leak()


def test_equal_priority_arrival_never_preempts_even_when_aged():
    h = StepHarness(page_size=PS, max_running=2, max_wait_steps=2)
    for i in range(2):
        h.submit(prompt(i), max_tokens=20, ignore_eos=True, priority=3)
    h.step()
    late = h.submit(prompt(9), max_tokens=2, priority=3)
    for _ in range(10):                                 # it ages past the running ones
        h.step()
    assert h.scheduler.preemptions == 0 and late.admit_time is None
    h.run()
    h.assert_no_leak()


def test_higher_arrival_preempts_for_kv_pages_and_reuses_them():
    # 16 pages of 4 tokens; two low requests grow until the pool is nearly full.
    h = StepHarness(page_size=PS, num_pages=16, max_running=8)
    lows = [h.submit(prompt(i), max_tokens=18, ignore_eos=True, priority=0) for i in range(2)]
    reqs = [g.children[0] for g in lows]
    while not all(r.page_table is not None and len(r.page_table.pages) >= 7 for r in reqs):
        h.step()
    held = set(reqs[1].page_table.pages)                # the newest low request is the victim
    hi = h.submit(prompt(9), max_tokens=4, ignore_eos=True, priority=9)
    h.step()
    top = hi.children[0]
    assert top in h.scheduler.running and reqs[1].preemptions == 1
    assert set(top.page_table.pages) & held, "the victim's pages were not reused"
    h.run()
    assert hi.finish_time < lows[1].finish_time
    for g, n in ((lows[0], 18), (lows[1], 18), (hi, 4)):
        assert g.children[0].output_ids == expected_tokens(g.prompt_ids, n)
    h.assert_no_leak()


def _low_admitted_after(max_wait_steps: int, gap: int = 2, limit: int = 60) -> int | None:
    """One slot; a low request (priority 0) waits while a request ``gap`` levels higher
    arrives every step. Returns the low one's waiting steps at admission (None: starved)."""
    h = StepHarness(page_size=PS, max_running=1, max_wait_steps=max_wait_steps)
    h.submit(prompt(0), max_tokens=1, priority=gap)
    h.step()
    low = h.submit(prompt(1), max_tokens=1, priority=0)
    for k in range(limit):
        h.submit(prompt(2 + k), max_tokens=1, priority=gap)
        h.step()
        if low.admit_time is not None:
            return low.children[0].wait_steps
    return None


def test_aging_bound_against_continuous_higher_arrivals():
    assert _low_admitted_after(max_wait_steps=10**9) is None          # no aging: starves
    for age, gap in ((4, 2), (3, 5)):
        waited = _low_admitted_after(max_wait_steps=age, gap=gap)
        assert waited is not None and gap * age <= waited <= (gap + 1) * age


def test_per_label_totals():
    h = StepHarness(page_size=PS, max_running=2, max_agent_labels=1)
    h.submit(prompt(0), max_tokens=3, ignore_eos=True, agent="planner")
    h.submit(prompt(1), max_tokens=2, ignore_eos=True, agent="planner")
    h.submit(prompt(2), max_tokens=4, ignore_eos=True, agent="researcher")   # over the bound
    h.submit(prompt(3), max_tokens=1, ignore_eos=True)
    h.run()
    stats = h.agent_stats.snapshot()
    assert set(stats) == {"planner", "other", "unlabeled"}
    assert stats["planner"]["requests"] == 2 and stats["planner"]["generated_tokens"] == 5
    assert stats["planner"]["prompt_tokens"] == 24
    assert stats["other"]["generated_tokens"] == 4 and stats["unlabeled"]["requests"] == 1
    assert stats["planner"]["queue_s"] >= 0 and stats["other"]["queue_s"] > 0
    h.assert_no_leak()


def test_random_priorities_in_a_tiny_pool_keep_outputs_and_pages():
    """Mixed priorities, 3 slots and 14 pages of 4 tokens: preemptions for slots and pages
    happen, every request still ends with the fake model's greedy tokens, nothing leaks."""
    import random

    rng = random.Random(0)
    preempted = 0
    for _ in range(10):
        h = StepHarness(page_size=PS, num_pages=14, max_batch_tokens=256, max_running=3)
        groups = [h.submit([rng.randint(1, 60) for _ in range(rng.randint(8, 36))],
                           max_tokens=16, ignore_eos=True,
                           priority=rng.choice([0, 5, -2, 1, 9, 3])) for _ in range(8)]
        h.run(3000)
        for g in groups:
            assert g.error is None and g.children[0].output_ids == expected_tokens(
                g.prompt_ids, 16)
        preempted += h.scheduler.preemptions
        h.assert_no_leak()
    assert preempted > 0


def _tokens_by(step, pred) -> int:
    return sum(len(it.tokens) for it in step if pred(it.req))


def test_urgent_step_runs_a_high_prefill_before_lower_chunks():
    """Low requests with long prompts are mid-prefill (their chunks alone fill the budget);
    a high arrival is computed whole in the next step, next to at most 3 low tokens."""
    h = StepHarness(page_size=PS, max_batch_tokens=32, max_running=8,
                    max_lower_priority_tokens=3)
    lows = [h.submit(prompt(i, 100), max_tokens=4, ignore_eos=True) for i in range(3)]
    h.step()
    assert lows[0].children[0].num_uncomputed > 32            # its chunk fills the next step
    hi = h.submit(prompt(9, 12), max_tokens=3, ignore_eos=True, priority=1)
    h.step()
    step = h.runner.steps[-1]
    assert _tokens_by(step, lambda r: r.group is hi) == 12   # the whole prompt: first token
    assert _tokens_by(step, lambda r: r.priority == 0) == 3
    assert len(hi.children[0].output_ids) == 1
    h.run()
    for g, n in [(g, 4) for g in lows] + [(hi, 3)]:
        assert g.children[0].output_ids == expected_tokens(g.prompt_ids, n)
    h.assert_no_leak()


def test_without_a_higher_prefill_steps_are_unchanged():
    """Equal priorities (aged or not) and a decoding high request: full steps for everyone."""
    for prios in ([0, 0, 0], [4, 4, 4]):
        h = StepHarness(page_size=PS, max_batch_tokens=32, max_running=2, max_wait_steps=1,
                        max_lower_priority_tokens=1)
        for i, p in enumerate(prios):
            h.submit(prompt(i, 40), max_tokens=6, ignore_eos=True, priority=p)
        h.run()
        # every step is full until the prefills are done: nothing was held to 1 token
        assert [sum(len(it.tokens) for it in s) for s in h.runner.steps[:2]] == [32, 32]
        h.assert_no_leak()


def test_lower_priorities_progress_under_sustained_urgent_steps():
    """A high-priority prefill in every step: a running low request still gets its token
    budget each step (oldest admission first) and finishes with its greedy tokens."""
    h = StepHarness(page_size=PS, max_batch_tokens=16, max_running=16,
                    max_lower_priority_tokens=1)
    low = h.submit(prompt(0, 8), max_tokens=12, ignore_eos=True)
    h.step()
    req = low.children[0]
    for k in range(12):
        if req.finish_reason is not None:
            break
        h.submit(prompt(1 + k, 24), max_tokens=1, ignore_eos=True, priority=2)
        before = req.num_computed
        h.step()
        assert any(it.req.priority == 2 and len(it.tokens) > 1 for it in h.runner.steps[-1])
        assert req.num_computed == before + 1            # one low token per urgent step
        assert sum(len(it.tokens) for it in h.runner.steps[-1]) == 16
    assert req.preemptions == 0
    h.run()
    assert req.output_ids == expected_tokens(low.prompt_ids, 12)
    h.assert_no_leak()


def test_random_priorities_with_chunked_prefill_keep_outputs_and_pages():
    """Urgent steps with small budgets, chunked prefills and a tiny pool: greedy tokens and
    pages as without priorities."""
    import random

    rng = random.Random(1)
    for _ in range(10):
        h = StepHarness(page_size=PS, num_pages=24, max_batch_tokens=12, max_running=4,
                        max_lower_priority_tokens=rng.choice([1, 2, 5]))
        groups = []
        for k in range(10):
            groups.append(h.submit([rng.randint(1, 60) for _ in range(rng.randint(5, 30))],
                                   max_tokens=8, ignore_eos=True,
                                   priority=rng.choice([0, 0, 3, 7])))
            if k % 3 == 2:
                h.step()
        h.run(3000)
        for g in groups:
            assert g.error is None and g.children[0].output_ids == expected_tokens(
                g.prompt_ids, 8)
        h.assert_no_leak()
