"""Sessions on the real engine: a session's history survives cache pressure that evicts plain
LRU entries, outputs are identical with and without sessions, holds give pages back before any
request waits, TTL / close release them, SGLang-style turns rebuild the prompt, nothing leaks."""

import time

import pytest

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.session.session import SessionError, TurnParams

pytestmark = pytest.mark.slow

TOPICS = ["lighthouses", "volcanoes", "honey bees", "glaciers", "the printing press"]


def history(i: int) -> str:
    t = TOPICS[i]
    return (f"Agent {i} researches {t}. Tools: search(query), read(url). " * 14
            + f"Task: write a short note about {t}.")


def greedy(n=8, **kw):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, **kw)


def make(model_path, **kw):
    return Engine(model_path, page_size=16, **{"num_pages": 40, **kw})


def run_agents(eng, with_session: bool):
    """Agent 0 ends a turn, three others pass through the cache, agent 0 continues."""
    eng.flush_cache()
    first = eng.generate(history(0), greedy(session="agent-0" if with_session else None))
    for i in (1, 2, 3):
        eng.generate(history(i), greedy())
    follow = history(0) + first.outputs[0].text + " Observation: found 3 sources."
    second = eng.generate(follow, greedy(session="agent-0" if with_session else None))
    return first, second


@pytest.fixture(scope="module")
def eng(model_path):
    return make(model_path)


def test_a_session_keeps_its_history_through_pressure_and_outputs_do_not_change(eng):
    plain = run_agents(eng, with_session=False)
    assert plain[1].meta["cached_tokens"] == 0          # LRU evicted the paused agent first
    kept = run_agents(eng, with_session=True)
    n_hist = len(kept[0].prompt_token_ids)
    assert kept[1].meta["cached_tokens"] >= n_hist // 16 * 16
    assert [o.outputs[0].token_ids for o in kept] == [o.outputs[0].token_ids for o in plain]
    m = eng.metrics()
    assert m["session_releases_continued"] >= 1 and m["evictions"] > 0
    eng.sessions.close("agent-0")
    eng.step()
    eng.cache.check_integrity()
    eng.flush_cache()
    assert eng.metrics()["pages_used"] == 0


def test_holds_give_pages_back_before_a_request_waits(model_path):
    eng = make(model_path, session_max_fraction=1.0)
    for i in range(2):
        eng.generate(history(i), greedy(session=f"a{i}"))
    held = eng.metrics()["session_held_pages"]
    assert held >= 28 and eng.metrics()["session_holds"] == 2
    assert eng.metrics()["pages_free"] < 16
    big = history(3) + history(4)                      # needs more pages than are free
    out = eng.generate(big, greedy(priority=10))
    assert out.error is None and len(out.outputs[0].token_ids) == 8
    m = eng.metrics()
    assert m["session_releases_pressure"] >= 1 and m["preemptions"] == 0
    assert out.meta["queue_s"] < 5.0
    eng.cache.check_integrity()


def test_ttl_and_close_release_and_nothing_leaks(model_path):
    eng = make(model_path, session_hold_s=0.2)
    eng.generate(history(0), greedy(session="short"))
    assert eng.metrics()["session_holds"] == 1
    time.sleep(0.3)
    eng.step()                                         # holds expire at a step
    m = eng.metrics()
    assert m["session_holds"] == 0 and m["session_releases_expired"] == 1
    eng.generate(history(1), greedy(session="closed-one"))
    assert eng.sessions.close("closed-one") and not eng.sessions.close("closed-one")
    eng.step()
    m = eng.metrics()
    assert m["session_holds"] == 0 and m["sessions_open"] == 1   # "short" stays open
    eng.flush_cache()
    assert eng.metrics()["pages_used"] == 0
    eng.cache.check_integrity()


def test_sglang_turns_rebuild_the_prompt(eng, tokenizer):
    sid = eng.sessions.open(capacity_of_str_len=1500)

    def turn(new_rid, text, **kw):
        ids = eng.sessions.turn_prompt(TurnParams(sid, **kw), tokenizer.encode(text), 8,
                                       new_rid)
        out = list(eng.generate_stream(ids, greedy(session=sid), request_id=new_rid))[-1]
        return ids, out.output

    ids0, t0 = turn("t0", history(0))
    ids1, t1 = turn("t1", " Next step:", rid="t0")
    assert ids1 == ids0 + t0.outputs[0].token_ids + tokenizer.encode(" Next step:")
    assert t1.meta["cached_tokens"] >= len(ids0) // 16 * 16
    ids2, t2 = turn("t2", " Instead:", rid="t0", offset=len(ids0), replace=True)
    assert ids2 == ids0 + tokenizer.encode(" Instead:")
    reference = eng.generate(ids2, greedy())
    assert t2.outputs[0].token_ids == reference.outputs[0].token_ids
    with pytest.raises(SessionError, match="session_params.rid: no turn 't1'"):
        eng.sessions.turn_prompt(TurnParams(sid, rid="t1"), [5], 8, "t3")   # replaced
    with pytest.raises(SessionError, match="capacity"):
        eng.generate(ids2, greedy(1400, session=sid))
    assert eng.sessions.close(sid)


def test_sessions_are_per_namespace(eng):
    sid = eng.sessions.open("tenant-session", cache_salt="tenant-a")
    with pytest.raises(SessionError) as e:
        eng.sessions.turn_prompt(TurnParams(sid), [5, 6], 4, "x", cache_salt="tenant-b")
    assert e.value.status == 404
    assert not eng.sessions.close(sid)                        # no salt: another namespace
    assert eng.sessions.close(sid, cache_salt="tenant-a")


def held(eng):
    """{session id: pages its hold keeps} of the sessions holding something."""
    return {r.id: r.held_pages for r in eng.sessions.rows() if r.held_pages}


def test_next_use_hints_order_what_pressure_releases(model_path):
    """Under pressure the session expected back last loses its hold first: by the request's
    ``next_use_s``, or by a hint sent after the turn (which overrides it)."""
    for hinted_after in (False, True):
        eng = make(model_path, session_max_fraction=1.0)
        soon, later = (100.0, 1.0) if hinted_after else (1.0, 100.0)
        eng.generate(history(0), greedy(session="soon", next_use_s=soon))
        eng.generate(history(1), greedy(session="later", next_use_s=later))
        if hinted_after:
            assert eng.sessions.hint("soon", 2.0) > 0 and eng.sessions.hint("later", 60.0) > 0
        assert set(held(eng)) == {"soon", "later"}
        out = eng.generate(history(3), greedy(priority=10))    # needs one hold's pages
        assert out.error is None
        assert set(held(eng)) == {"soon"}, hinted_after
        assert eng.metrics()["session_releases_pressure"] == 1
        eng.cache.check_integrity()


def test_a_hint_before_the_turn_ends_applies_to_its_hold_and_bad_hints_are_named(model_path):
    eng = make(model_path)
    sid = eng.sessions.open("early")
    assert eng.sessions.hint(sid, 7.5) == 0                    # nothing held yet
    t0 = time.monotonic()
    eng.generate(history(0), greedy(session=sid))
    t1 = time.monotonic()
    h = eng.scheduler.retention.holds()[0]
    # the turn ended between t0 and t1, and is expected back 7.5 s later (not the default ttl / 2)
    assert t0 + 7.5 - 0.01 <= h.expected_back <= t1 + 7.5 + 0.01, (h.expected_back - t0, t1 - t0)
    with pytest.raises(SessionError, match="session_id: no open session") as e:
        eng.sessions.hint("nobody", 1.0)
    assert e.value.status == 404
    for bad in (-1, 1e9, "soon", None):
        with pytest.raises(ValueError, match=r"next_use_s: must be in \[0, 86400\]"):
            eng.sessions.hint(sid, bad)
    with pytest.raises(ValueError, match="next_use_s: must be in"):
        greedy(next_use_s=-3)
    with pytest.raises(ValueError, match="next_use_s: a hint for a request whose KV is kept"):
        eng.generate(history(1), greedy(next_use_s=3.0))       # no session, no tools
    assert not eng.scheduler.has_work
    assert eng.sessions.close(sid)


def test_closing_a_session_demotes_its_history_but_not_its_first_prompt(model_path):
    eng = make(model_path, num_pages=80)
    ns = eng.builder.namespace(None)
    live = eng.generate(history(1), greedy())                  # an older live entry
    first = eng.generate(history(0), greedy(session="done"))
    follow = history(0) + first.outputs[0].text + " Observation: found it." * 8
    second = eng.generate(follow, greedy(24, session="done"))
    assert eng.sessions.close("done")
    demoted = eng.metrics()["session_demoted_pages"]
    assert demoted >= 1
    eng.cache.evict(demoted)                                   # exactly the dead pages go

    def hit(out):
        return eng.cache.match_prefix(out.prompt_token_ids, ns, record=False).length

    n_first = len(first.prompt_token_ids)
    assert hit(live) == len(live.prompt_token_ids) // 16 * 16  # the older live entry: whole
    assert hit(first) == n_first // 16 * 16                    # the first prompt stays
    assert hit(second) == -(-n_first // 16) * 16               # the rest of the history went
    eng.cache.check_integrity()
