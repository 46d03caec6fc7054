"""Greedy outputs do not depend on batching, cache state, page size, chunking or preemption."""

import pytest

from agentlang.runtime import Engine, SamplingParams

pytestmark = pytest.mark.slow
N_NEW = 24


@pytest.fixture(scope="module")
def reference(prompt_ids, oracle):
    return [list(oracle.continuation(tuple(p), N_NEW)) for p in prompt_ids]


def greedy(**kw):
    return SamplingParams(max_tokens=N_NEW, temperature=0, ignore_eos=True, **kw)


def check(oracle, prompt_ids, outs, reference, label):
    for p, o, ref in zip(prompt_ids, outs, reference):
        oracle.assert_same(p, o.token_ids, ref, label)


@pytest.mark.parametrize("page_size", [1, 16])
def test_alone_batched_cold_warm(model_path, oracle, prompt_ids, reference, page_size):
    eng = Engine(model_path, page_size=page_size, kv_budget_mb=64)
    alone = [eng.generate(p, greedy()) for p in prompt_ids]          # one at a time
    check(oracle, prompt_ids, alone, reference, f"alone ps={page_size}")
    eng.flush_cache()
    cold = eng.generate(prompt_ids, greedy())                         # together, cold cache
    check(oracle, prompt_ids, cold, reference, f"batch-cold ps={page_size}")
    warm = eng.generate(prompt_ids, greedy())                         # together, warm cache
    check(oracle, prompt_ids, warm, reference, f"batch-warm ps={page_size}")
    assert sum(o.meta["cached_tokens"] for o in warm) > 0
    for a, b in zip(cold, warm):
        assert a.token_ids == b.token_ids


def test_chunked_prefill(model_path, oracle, prompt_ids, reference):
    eng = Engine(model_path, page_size=16, kv_budget_mb=64, max_batch_tokens=8)
    outs = eng.generate(prompt_ids, greedy())
    check(oracle, prompt_ids, outs, reference, "chunked max_batch_tokens=8")


def test_preemption_keeps_outputs(model_path, oracle, prompt_ids, reference):
    # 14 pages of 4 tokens: 8 requests of up to ~60 tokens cannot all run at once.
    eng = Engine(model_path, page_size=4, num_pages=14, max_batch_tokens=256)
    outs = eng.generate(prompt_ids, greedy())
    assert eng.metrics()["preemptions"] > 0, "the KV budget did not force preemption"
    check(oracle, prompt_ids, outs, reference, "preemption")
    eng.flush_cache()
    assert eng.allocator.num_free == eng.allocator.num_pages
    eng.cache.check_integrity()


def test_chunked_prefill_on_the_gguf_blocks(prompt_ids):
    """The embedded GGUF on the native kernels: a prompt cut into chunks decodes as one prefill
    does, and as a warm cache does, to the bits of every logprob (each prefill row has a
    decode's arithmetic in the native layer). A chunk step has no logits rows, so the head
    multiplies 0 rows (on the AMX build that once divided by zero and killed the process)."""
    from agentlang.runtime.weights.model_loader import resolve_model

    path = resolve_model("default", "auto").path
    prompts = [p for p in prompt_ids if len(p) > 8] + [list(range(100, 300))]
    eng = Engine(path, weights="auto", kv_budget_mb=64)
    whole = [eng.generate(p, greedy(logprobs=0)) for p in prompts]
    warm = [eng.generate(p, greedy(logprobs=0)) for p in prompts]   # the prompt from the cache
    assert warm[-1].meta["cached_tokens"] >= 192                 # the 200-token prompt's pages
    eng = Engine(path, weights="auto", kv_budget_mb=64, max_batch_tokens=8)
    cut = [eng.generate(p, greedy(logprobs=0)) for p in prompts]    # alone: chunks, no logits
    for runs in (warm, cut):
        assert [o.token_ids for o in runs] == [o.token_ids for o in whole]
        assert [[lp.logprob for lp in o.outputs[0].logprobs] for o in runs] == \
            [[lp.logprob for lp in o.outputs[0].logprobs] for o in whole]
