"""Output processing on the model-free step harness: stop conditions, n > 1 forks, streaming
deltas, prompt logprobs across prefill chunks, counters, aborts, grammar waits, failures."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from agentlang.runtime.core.errors import EngineError, ErrorCode
from tests.support.step_harness import EOS, StepHarness, expected_tokens, greedy, next_token


def only(group):
    (c,) = group.output().outputs
    return c


def test_max_tokens_and_counters():
    h = StepHarness()
    g = h.submit([1, 2, 3], max_tokens=5)
    h.run()
    c = only(g)
    assert c.token_ids == [4, 5, 6, 7, 8] and c.finish_reason == "length"
    assert c.text == "efghi"
    counters = h.tracker.counters
    assert (counters.prompt_tokens, counters.generated_tokens, counters.requests_finished) \
        == (3, 5, 1)
    assert h.tracker.get(g.rid) is None
    h.assert_no_leak()


def test_eos_stops_unless_ignored_and_min_tokens_bans_it():
    prompt = [EOS - 3]
    h = StepHarness()
    stop, ignore, banned = (h.submit(prompt, max_tokens=6),
                            h.submit(prompt, max_tokens=6, ignore_eos=True),
                            h.submit([EOS - 1], max_tokens=2, min_tokens=1))
    h.run()
    assert only(stop).token_ids == [EOS - 2, EOS - 1, EOS]
    assert (only(stop).finish_reason, only(stop).matched_stop) == ("stop", EOS)
    assert only(ignore).token_ids == expected_tokens(prompt, 6)
    assert only(banned).token_ids[0] != EOS     # EOS banned before min_tokens
    h.assert_no_leak()


def test_stop_token_ids_and_stop_strings():
    h = StepHarness()
    by_id = h.submit([1], max_tokens=10, stop_token_ids=[4])
    by_text = h.submit([1], max_tokens=10, stop=["de"])
    kept = h.submit([1], max_tokens=10, stop=["de"], include_stop_str_in_output=True)
    h.run()
    assert (only(by_id).token_ids, only(by_id).matched_stop) == ([2, 3, 4], 4)
    assert (only(by_text).text, only(by_text).matched_stop) == ("c", "de")
    assert only(kept).text == "cde"
    h.assert_no_leak()


def test_context_limit_finishes_with_length():
    h = StepHarness(max_context=8)
    g = h.submit([1, 2, 3, 4, 5], max_tokens=100)
    h.run()
    assert only(g).token_ids == [6, 7, 8] and only(g).finish_reason == "length"
    h.assert_no_leak()


def test_n_forks_at_first_sample_and_shares_the_prompt():
    h = StepHarness(page_size=4)
    g = h.submit(list(range(1, 11)), max_tokens=4, n=3)
    h.step()                                        # prefill + first sample + fork
    assert len(g.children) == 3
    first = g.children[0].page_table.pages
    for sib in g.children[1:]:
        assert sib.page_table.pages[:2] == first[:2]   # full prompt pages shared
        assert sib.num_computed == g.children[0].num_computed
    assert len(h.scheduler.running) == 3
    h.run()
    outs = g.output().outputs
    assert [o.index for o in outs] == [0, 1, 2]
    assert all(o.token_ids == expected_tokens(list(range(1, 11)), 4) for o in outs)
    assert h.tracker.counters.generated_tokens == 12
    h.assert_no_leak()


def test_stream_deltas_add_up_and_the_last_carries_the_output():
    h = StepHarness()
    deltas = []
    g = h.builder.group([1, 2], greedy(max_tokens=4, n=2))
    g.sink = deltas.append
    h.processor.add(g)
    h.run()
    assert deltas[-1].output is not None and all(d.output is None for d in deltas[:-1])
    for i in (0, 1):
        mine = [d for d in deltas if d.index == i]
        assert sum((d.token_ids for d in mine), []) == [3, 4, 5, 6]
        assert "".join(d.text for d in mine) == "defg"
        assert mine[-1].finished and not any(d.finished for d in mine[:-1])
    assert deltas[-1].output.outputs[1].token_ids == [3, 4, 5, 6]


@pytest.mark.parametrize("budget", [256, 5])
def test_prompt_logprobs_map_rows_to_positions_across_chunks(budget):
    h = StepHarness(max_batch_tokens=budget)
    prompt = [1, 2, 3, 9, 10, 11, 30, 31, 32, 33, 40, 41]
    g = h.builder.group(prompt, greedy(max_tokens=1), prefill_only=True, logprob_start=2)
    h.processor.add(g)
    h.run()
    lps = g.prompt_logprobs
    assert lps[:2] == [None, None]
    for pos in range(2, len(prompt)):               # the fake model predicts prev + 1
        predicted = next_token(prompt[pos - 1]) == prompt[pos]
        assert (lps[pos] > -1e-3) if predicted else (lps[pos] < -19), (pos, lps[pos])
    assert only(g).token_ids == [] and only(g).finish_reason == "length"   # nothing sampled: no budget
    h.assert_no_leak()


def test_abort_frees_everything_and_fail_all_reports():
    h = StepHarness()
    a = h.submit([1, 2, 3], max_tokens=50, ignore_eos=True)
    b = h.submit([4, 5, 6], max_tokens=50, ignore_eos=True)
    h.step()
    h.step()
    h.processor.abort(a.rid)
    assert only(a).finish_reason == "abort" and h.tracker.get(a.rid) is None
    h.processor.abort("no-such-request")            # unknown ids are ignored
    boom = EngineError(ErrorCode.ENGINE_FAILURE, None, "engine error: boom")
    h.processor.fail_all(boom)
    assert only(b).finish_reason == "abort" and b.output().error == boom
    assert h.tracker.rids() == []
    h.assert_no_leak()


def test_grammar_wait_then_failure_aborts_with_the_reason():
    h = StepHarness()
    fut: Future = Future()
    g = h.builder.group([1, 2], greedy(max_tokens=3))
    g.grammar = fut
    h.processor.add(g)
    assert h.tracker.num_waiting_grammar == 1 and h.step() is True
    assert not g.children                           # still waiting, not queued
    fut.set_exception(ValueError("regex: unsupported"))
    h.run()
    assert only(g).finish_reason == "abort"
    assert g.output().error == EngineError(ErrorCode.INVALID_CONSTRAINT, None, "regex: unsupported")
    assert h.tracker.num_waiting_grammar == 0 and h.tracker.counters.requests_finished == 1
    h.assert_no_leak()


def test_abort_while_waiting_for_grammar():
    h = StepHarness()
    g = h.builder.group([1, 2], greedy(max_tokens=3))
    g.grammar = Future()
    h.processor.add(g)
    h.processor.abort(g.rid)
    assert only(g).finish_reason == "abort"
    assert h.tracker.num_waiting_grammar == 0 and not h.step()
    h.assert_no_leak()
