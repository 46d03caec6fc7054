"""Schedule policy ``live`` (``scheduler/live_programs.py``) on the model-free step harness:
once the pool is short (a preemption, a hold released at the cap), no new program starts while
as many programs are live (running or holding KV) as were live then; live programs' requests
still go; nothing runs → the gate opens; outputs and pages unchanged."""

from __future__ import annotations

import time
from types import SimpleNamespace

from agentlang.runtime.cache.retention import REASONS
import pytest

from agentlang.runtime.scheduler.live_programs import LivePrograms, busy_requests
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


def agents(policy: str, n: int = 6, turns: int = 4, num_pages: int = 30):
    """``n`` agents of ``turns`` turns each (8 generated + 8 new tokens a turn), all started
    together; each finished turn is held (``Scheduler.retain``) while its tool runs for 2, 4
    or 6 steps, then its next turn arrives: (tokens computed, the harness). Outputs are
    checked against the fake model."""
    h = StepHarness(page_size=PS, num_pages=num_pages, schedule_policy=policy,
                    retain_max_pages=num_pages)
    hist = {k: prompt(k, 16) for k in range(n)}
    left = dict.fromkeys(range(n), turns)
    cur = {k: h.submit(hist[k], max_tokens=8, ignore_eos=True, agent=f"a{k}") for k in hist}
    due: dict[int, int] = {}                       # agent -> step its next turn arrives
    for step in range(3000):
        busy = h.step()
        for k in [k for k, at in due.items() if at <= step]:
            del due[k]
            cur[k] = h.submit(hist[k], max_tokens=8, ignore_eos=True, agent=f"a{k}")
        for k in [k for k, g in cur.items() if g.finished]:
            child = cur.pop(k).children[0]
            assert child.output_ids == expected_tokens(hist[k], 8)
            left[k] -= 1
            if not left[k]:
                h.scheduler.retention.release(f"a{k}", "closed")
                h.scheduler.live.ended(f"a{k}")
                continue
            h.scheduler.retain(child, f"a{k}", time.monotonic(), 100.0, None)
            hist[k] = hist[k] + child.output_ids + [(k * 3 + left[k]) % 50 + 1] * 8
            due[k] = step + 2 * (1 + (k + left[k]) % 3)
        if not cur and not due and not busy:
            break
    assert not cur and not due
    h.scheduler.retention.release_all("flushed")
    h.assert_no_leak()
    computed = sum(len(it.tokens) for step in h.runner.steps for it in step)
    return computed, h


def test_growing_histories_are_shed_while_young():
    """Six agents whose final histories (72 tokens, 18 pages) fit one at a time in 30 pages:
    ``live`` projects their growth when the pool first runs short and sheds the paused ones over the
    limit then, so fewer histories are recomputed than with ``continue``; outputs unchanged,
    no page left behind."""
    work, _ = agents("continue")
    gated_work, h = agents("live")
    live, released = h.scheduler.live, h.scheduler.retention.stats.released
    assert live.lowered >= 1 and released["limit"] >= 1
    assert gated_work < 0.75 * work, (gated_work, work)   # the limit learnt from pressure alone: 0.93


class FakeRetention:
    """The part of ``Retention`` the limit reads: holds, release counters, release by key."""

    def __init__(self):
        self.stats = SimpleNamespace(released=dict.fromkeys(REASONS, 0))
        self.by_key: dict[str, SimpleNamespace] = {}

    def hold(self, key: str, back: float, pages: int) -> None:
        self.by_key[key] = SimpleNamespace(key=key, expected_back=back, rank=0, pages=pages)

    def holds(self):
        return list(self.by_key.values())

    def release(self, key: str, reason: str) -> bool:
        self.stats.released[reason] += self.by_key.pop(key, None) is not None
        return True


def req(agent: str):
    return SimpleNamespace(group=SimpleNamespace(session=None, rid=agent, namespace=(),
                                                 params=SimpleNamespace(agent=agent)),
                           name=agent)


def paused(live: LivePrograms, ret: FakeRetention, agent: str, turns: int, back: float) -> None:
    for _ in range(turns):
        live.held(agent, req(agent))
    ret.hold(agent, back, pages=4 * turns)


def test_the_limit_leaves_room_for_projected_growth_and_sheds_the_youngest():
    """Eight agents live (two running, six paused with 1-3 finished turns) when the pool runs
    short: before any session closed each is projected to twice its age, so half of them fit;
    the paused ones over the limit are shed smallest first, then expected back last."""
    live, ret = LivePrograms(ceiling=16, enabled=True), FakeRetention()
    for k, turns in enumerate((3, 3, 2, 2, 1, 1)):
        paused(live, ret, f"p{k}", turns, back=float(k))
    run = [req("r0"), req("r1")]
    for r in run:
        live.held(r.name, r)                       # each finished one turn before this one
    assert live.gate(run, ret, 0).limit == 16      # no pressure yet: the ceiling
    ret.stats.released["pressure"] += 1
    gate = live.gate(run, ret, 0)
    # ages: 3 3 2 2 1 1 (paused) + 2 2 (running) = 16 turns held; projected 32
    assert live.limit == 4 and live.lowered == 1
    assert sorted(k for k in ret.by_key) == ["p0", "p1"]     # p5, p4 (4 pages), then p3, p2
    assert ret.stats.released["limit"] == 4 and live.live_now == 4
    assert not gate.allows(req("new")) and gate.allows(run[0])
    assert live.gate(run, ret, 0).limit == 4                  # shedding is not a finish


def test_closed_sessions_teach_the_program_length():
    """Once sessions closed after 3 turns, a pool full of 2-turn programs is projected to
    hold 5 of the 8 live ones at their end (twice their age, before any closed: 4); a program
    that never paused counts as its own request."""
    live, ret = LivePrograms(ceiling=16, enabled=True), FakeRetention()
    for k in range(2):
        paused(live, ret, f"done{k}", 3, back=0.0)
        ret.release(f"done{k}", "closed")
        live.ended(f"done{k}")
    assert live.length == 3
    for k in range(6):
        paused(live, ret, f"p{k}", 2, back=float(k))
    fresh = [req(f"f{k}") for k in range(2)]                  # first requests: age 1, length 1
    live.gate(fresh, ret, 0)
    live.gate(fresh, ret, 1)                                  # a preemption: pressure
    # 8 live; ages 2 x 6 + 1 x 2 = 14; projected 3 x 6 + 1 x 2 = 20 -> floor(8 * 14 / 20) = 5
    assert live.limit == 5 and len(ret.by_key) == 3


def test_the_policy_off_keeps_no_counts():
    live, ret = LivePrograms(ceiling=16, enabled=False), FakeRetention()
    paused(live, ret, "p", 3, back=0.0)
    live.ended("p")
    ret.stats.released["pressure"] += 1
    gate = live.gate([], ret, 5)
    assert gate.allows(req("x")) and live.limit == 16 and live.length is None
    assert len(ret.by_key) == 1


def test_the_limit_grows_by_one_per_round_of_ended_programs():
    """After pressure set the limit to 4 (four paused programs shed), it grows by one only
    once 4 programs ended: a slow climb back, not one step per ended program."""
    live, ret = LivePrograms(ceiling=16, enabled=True), FakeRetention()
    for k in range(8):
        paused(live, ret, f"p{k}", 1, back=float(k))
    live.gate([], ret, 1)                         # ages 1, projected 2 each -> 8 * 8 // 16
    assert live.limit == 4 and len(ret.by_key) == 4
    limits = []
    for key in list(ret.by_key):
        ret.release(key, "expired")
        limits.append(live.gate([], ret, 1).limit)
    assert limits == [4, 4, 4, 5]


def test_one_pressure_event_at_most_halves_the_limit():
    """Sessions of 8 turns closed; eight 1-turn programs project to 1 fitting, but the limit
    falls only to half of the live ones."""
    live, ret = LivePrograms(ceiling=16, enabled=True), FakeRetention()
    paused(live, ret, "done", 8, back=0.0)
    ret.release("done", "closed")
    live.ended("done")
    for k in range(8):
        paused(live, ret, f"p{k}", 1, back=float(k))
    live.gate([], ret, 1)
    assert live.limit == 4 and len(ret.by_key) == 4


def test_new_programs_start_while_fewer_requests_than_busy_run():
    """``busy_requests`` 2: of five agents arriving together two start; three single calls
    (their own programs) are not held back; when a running agent pauses on a tool (its turn
    held) while the other still runs, one waiting agent starts although the paused one stays
    live, and only one; outputs unchanged, no page left behind."""
    h = StepHarness(page_size=PS, schedule_policy="live", busy_requests=2, retain_max_pages=64)
    tokens = [4, 12, 8, 8, 8]
    progs = [h.submit(prompt(k), max_tokens=n, ignore_eos=True, agent=f"a{k}")
             for k, n in enumerate(tokens)]
    singles = [h.submit(prompt(10 + k), max_tokens=2, ignore_eos=True) for k in range(3)]
    h.step()
    assert [g.admit_time is not None for g in progs] == [True, True, False, False, False]
    assert all(g.admit_time is not None for g in singles)
    while not progs[0].finished:
        h.step()
    h.scheduler.retain(progs[0].children[0], "a0", time.monotonic(), 100.0, None)
    assert progs[2].admit_time is None and not progs[1].finished
    h.step()                                  # a0 paused: one request fewer runs
    assert [g.admit_time is not None for g in progs] == [True, True, True, False, False]
    assert h.scheduler.live.live_now == 3     # a0 (held), a1, a2
    h.run()
    for k, g in enumerate(progs):
        assert g.children[0].output_ids == expected_tokens(prompt(k), tokens[k])
    for k, g in enumerate(singles):
        assert g.children[0].output_ids == expected_tokens(prompt(10 + k), 2)
    h.scheduler.retention.release_all("flushed")
    h.assert_no_leak()


def test_busy_requests_from_the_row_cost():
    """The fewest rows reaching 80 % of the peak rows per second ``1 / c``: a compute-bound
    step (c = 1) one, 2 AVX2 cores (0.35) 8, a memory-bound step (0.01) hundreds."""
    assert [busy_requests(c) for c in (1.0, 0.5, 0.35, 0.2, 0.01)] == [1, 4, 8, 16, 396]
    for c in (0.5, 0.35, 0.2):
        r = busy_requests(c)
        rate = lambda n: n / (1 + c * (n - 1))          # noqa: E731
        assert rate(r) >= 0.8 / c > rate(r - 1)
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="row_cost"):
            busy_requests(bad)
