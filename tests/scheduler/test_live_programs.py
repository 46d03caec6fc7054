"""Schedule policy ``live`` (``scheduler/live_programs.py``) on the model-free step harness:
once the pool is short (a preemption, a hold released at the cap), no new program starts while
as many programs are live (running or holding KV) as were live then; live programs' requests
still go; nothing runs → the gate opens; outputs and pages unchanged."""

from __future__ import annotations

import time

from tests.support.step_harness import StepHarness, expected_tokens

PS = 4


def prompt(k: int, n: int = 12) -> list[int]:
    return [(k * 7) % 50 + 1] + [(k + i) % 50 + 1 for i in range(1, n)]


def crowded(policy: str) -> tuple[int, int, StepHarness]:
    """Eight agents whose 72-token requests fit one or two at a time (30 pages of 4 tokens):
    the preemptions, the tokens computed, and the harness (outputs checked, no leak)."""
    h = StepHarness(page_size=PS, num_pages=30, schedule_policy=policy)
    groups = [h.submit(prompt(k), max_tokens=60, ignore_eos=True, agent=f"a{k}")
              for k in range(8)]
    h.run()
    for k, g in enumerate(groups):
        assert g.children[0].output_ids == expected_tokens(prompt(k), 60)
    h.assert_no_leak()
    computed = sum(len(it.tokens) for step in h.runner.steps for it in step)
    return h.scheduler.preemptions, computed, h


def test_pressure_lowers_the_limit_and_fewer_histories_are_lost():
    """All eight start at once (no pressure yet); each preemption lowers the limit, so the
    preempted wait for a live one to end instead of coming back to be preempted again."""
    thrash, work, _ = crowded("continue")
    gated, gated_work, h = crowded("live")
    live = h.scheduler.live
    assert live.lowered >= 1 and live.limit < live.ceiling and live.live_now <= live.limit
    assert gated < thrash and gated_work < work, (gated, thrash, gated_work, work)


def test_a_hold_keeps_its_program_live_and_new_programs_wait():
    """b's hold (a's was released at the cap: pressure) keeps b live; with b's next call
    running, a new program c waits under ``live`` until nothing runs, while ``continue``
    admits it at once."""
    def c_waits(policy: str) -> bool:
        h = StepHarness(page_size=PS, schedule_policy=policy, retain_max_pages=6)
        for key, k in (("ka", 1), ("kb", 2)):
            g = h.submit(prompt(k), max_tokens=8, ignore_eos=True, agent=key)
            h.run()
            h.scheduler.retain(g.children[0], key, time.monotonic(), 100.0, None)
        assert [x.key for x in h.scheduler.retention.holds()] == ["kb"]   # ka: at the cap
        b2 = h.submit(prompt(5), max_tokens=12, ignore_eos=True, agent="kb")
        h.step()
        c1 = h.submit(prompt(6), max_tokens=4, ignore_eos=True, agent="kc")
        h.step()
        waited = c1.admit_time is None
        h.run()
        assert c1.admit_time > b2.admit_time
        assert c1.children[0].output_ids == expected_tokens(prompt(6), 4)
        h.scheduler.retention.release_all("flushed")
        h.assert_no_leak()
        return waited

    assert c_waits("live")
    assert not c_waits("continue")
