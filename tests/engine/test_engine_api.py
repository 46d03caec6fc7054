"""Engine API: prefix reuse, stop strings, seeds, n>1 via copy-on-write, streaming, abort,
bad input."""

import asyncio

import pytest

from agentlang.runtime import Engine, SamplingParams

pytestmark = pytest.mark.slow

LONG_PREFIX = (
    "You are a meticulous assistant for a library. The catalogue lists books by author, title, "
    "year and shelf. Answer questions about the catalogue briefly and precisely. "
) * 10


@pytest.fixture(scope="module")
def eng(model_path):
    return Engine(model_path, page_size=16, kv_budget_mb=96)


def greedy(n=16, **kw):
    return SamplingParams(max_tokens=n, temperature=0, **kw)


def test_second_request_computes_only_its_suffix(eng, tokenizer):
    prefix_ids = tokenizer.encode(LONG_PREFIX)
    assert len(prefix_ids) >= 300
    prompt = LONG_PREFIX + "Question: who wrote Hamlet?"
    eng.flush_cache()
    cold = eng.generate(prompt, greedy(12, ignore_eos=True))
    before = eng.metrics()["tokens_run"]
    warm = eng.generate(prompt, greedy(12, ignore_eos=True))
    run = eng.metrics()["tokens_run"] - before
    n_prompt = len(warm.prompt_token_ids)
    cached = warm.meta["cached_tokens"]
    assert cached >= 300
    # Only the uncached suffix of the prompt plus the decode steps ran through the model.
    assert run == (n_prompt - cached) + (12 - 1)
    assert warm.token_ids == cold.token_ids


def test_stop_string_spanning_tokens(eng, tokenizer):
    prompt = "Count: 1, 2, 3,"
    free = eng.generate(prompt, greedy(24))
    text = free.text
    stop = text[7:11]                       # a 4-char window, very likely across a token edge
    out = eng.generate(prompt, greedy(24, stop=[stop]))
    assert out.finish_reason == "stop" and out.outputs[0].matched_stop == stop
    assert out.text == text[: text.index(stop)]
    incl = eng.generate(prompt, greedy(24, stop=[stop], include_stop_str_in_output=True))
    assert incl.text == text[: text.index(stop) + len(stop)]


def test_seed_reproducible_and_n4_computes_prompt_once(eng):
    prompt = ("Below is a list of twenty random, unrelated English words, one per line, chosen "
              "by a person who likes surprising vocabulary.\n1.")
    sp = SamplingParams(max_tokens=10, temperature=1.2, top_p=0.98, seed=1234, n=4)
    eng.flush_cache()
    before = eng.metrics()["tokens_run"]
    a = eng.generate(prompt, sp)
    run = eng.metrics()["tokens_run"] - before
    assert len(a.outputs) == 4
    n_prompt = len(a.prompt_token_ids)
    decode_tokens = sum(len(o.token_ids) - 1 for o in a.outputs)
    assert run == n_prompt + decode_tokens          # prompt computed once, not 4 times
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1
    b = eng.generate(prompt, sp)
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    eng.flush_cache()
    assert eng.allocator.num_free == eng.allocator.num_pages


def test_sampling_filters_keep_outputs_in_support(eng):
    out = eng.generate("The colour of the sky is", SamplingParams(
        max_tokens=8, temperature=1.5, top_k=1, seed=3))
    ref = eng.generate("The colour of the sky is", greedy(8))
    assert out.token_ids == ref.token_ids            # top_k=1 is greedy at any temperature


def test_logprobs(eng):
    out = eng.generate("The capital of France is", greedy(4, logprobs=3))
    lps = out.outputs[0].logprobs
    assert len(lps) == 4
    for tok, lp in zip(out.token_ids, lps):
        assert lp.token_id == tok and len(lp.top) == 3
        assert lp.top[0][0] == tok and abs(lp.top[0][1] - lp.logprob) < 1e-6


def test_stream_equals_blocking_and_abort_frees_pages(eng):
    prompt = "Tell me about the history of computing:"
    full = eng.generate(prompt, greedy(20))
    streamed = "".join(d.text for d in eng.generate_stream(prompt, greedy(20)))
    assert streamed == full.text
    eng.flush_cache()
    baseline = eng.allocator.num_used

    async def stream_and_abort():
        gen = eng.async_stream(prompt + " and more", greedy(200, ignore_eos=True))
        async for d in gen:
            if len(d.token_ids) and eng.metrics()["generated_tokens"] > 0:
                break
        await gen.aclose()
        for _ in range(100):
            await asyncio.sleep(0.05)
            if eng.metrics()["num_running"] == 0:
                break

    asyncio.run(stream_and_abort())
    eng.flush_cache()
    assert eng.allocator.num_used == baseline
    eng.cache.check_integrity()


def test_async_concurrent_requests_match_blocking(eng):
    prompts = [f"Fact number {i}:" for i in range(6)]
    ref = [eng.generate(p, greedy(8)).token_ids for p in prompts]

    async def go():
        return await asyncio.gather(*[eng.async_generate(p, greedy(8)) for p in prompts])

    outs = asyncio.run(go())
    assert [o.token_ids for o in outs] == ref


@pytest.mark.parametrize("kw, field", [
    (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(max_tokens=0), "max_tokens"), (dict(bogus=1), "bogus"), (dict(n=0), "n"),
    (dict(stop=[""]), "stop"), (dict(min_p=2), "min_p"),
])
def test_bad_sampling_values(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)


def test_bad_prompts_fail_alone(eng):
    for bad in ["", [], 42, None, [[1, 2], "x", 3]]:
        with pytest.raises(ValueError, match="prompt"):
            eng.generate(bad, greedy(2))
    with pytest.raises(ValueError, match="context|KV pool"):
        eng.generate([5] * (eng.max_context + 1), greedy(2))
    with pytest.raises(ValueError, match="KV pool"):
        small = Engine(eng.model_path, page_size=16, num_pages=4)
        small.generate([5] * 100, greedy(2))
    after = eng.generate("Still serving?", greedy(3))
    assert after.error is None and after.finish_reason in ("stop", "length")


def test_prefill_only_caches_the_prompt_and_samples_nothing(eng):
    prompt = LONG_PREFIX + "Question: which shelf holds poetry?"
    eng.flush_cache()
    before = eng.metrics()["tokens_run"]
    out = eng.generate(prompt, greedy(8, regex="[a-z]+", prompt_logprobs=0), prefill_only=True)
    n_prompt = len(out.prompt_token_ids)
    assert eng.metrics()["tokens_run"] - before == n_prompt        # the prompt, no decode step
    c = out.outputs[0]
    assert (c.text, list(c.token_ids), c.finish_reason) == ("", [], "length")
    assert out.prompt_logprobs[0] is None and all(lp <= 0 for lp in out.prompt_logprobs[1:])
    warm = eng.generate(prompt, greedy(4))
    assert warm.meta["cached_tokens"] >= n_prompt - eng.config.page_size
    with pytest.raises(ValueError, match="regex"):                  # still checked
        eng.generate(prompt, greedy(4, regex="("), prefill_only=True)
