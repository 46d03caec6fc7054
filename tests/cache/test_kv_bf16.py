"""``kv_dtype="bfloat16"``: a float32 model's K/V stored as bfloat16 (half the bytes; each value
rounded to nearest even once, when stored, and widened exactly when read). The layout and the
pool's store / gather / views / copies, the option's validation, and on the embedded GGUF: the
native layer reads it (batched, alone, chunked and cached prefills give the same bits) and its
next tokens agree with the float32 cache's."""

from __future__ import annotations

import pytest
import torch

from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.cache.kv_quant import check_kv_dtype_support
from agentlang.runtime.engine.config import EngineConfig


def test_layout_is_a_bfloat16_cache_without_scales():
    fp32 = KVLayout(30, 3, 64, torch.float32)
    narrow = KVLayout(30, 3, 64, torch.float32, "bfloat16")
    assert narrow.storage_dtype == torch.bfloat16 and narrow.dtype == torch.float32
    assert not narrow.quantized and narrow.format is None
    assert narrow.bytes_per_token() == fp32.bytes_per_token() // 2 == 23040
    assert narrow.kv_dtype_name == "bfloat16" != fp32.kv_dtype_name     # its own namespace


def test_pool_stores_rounded_values_and_reads_them_back_as_float32():
    layout = KVLayout(2, 3, 16, torch.float32, "bfloat16")
    pool = KVPool(layout, page_size=4, num_pages=6)
    assert pool.buffer.dtype == torch.bfloat16 and pool.scales is None
    assert pool.nbytes() == 6 * 4 * layout.bytes_per_token()
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(2, 7, 3, 16, generator=g) * 5
    slots = torch.tensor([9, 10, 11, 12, 13, 2, 3])        # pages 2, 3 and the end of page 0
    pool.store(1, slots, k, v)
    for which, x in ((0, k), (1, v)):
        want = x.to(torch.bfloat16).float()                 # nearest even, widened exactly
        assert not torch.equal(want, x)
        got = pool.gather(1, which, torch.tensor([[2, 3], [0, 0]]))   # [2, 2, S, H, D]
        assert got.dtype == torch.float32
        assert torch.equal(got[0].flatten(0, 1)[1:6], want[:5])
        assert torch.equal(got[1, 0, 2:], want[5:])
    kr, vr = pool.gather_kv(1, torch.tensor([2, 3]))       # a run of pages: read in place
    assert kr.dtype == vr.dtype == torch.float32
    assert torch.equal(kr.flatten(0, 1)[1:6], k[:5].to(torch.bfloat16).float())
    assert torch.equal(vr.flatten(0, 1)[1:6], v[:5].to(torch.bfloat16).float())
    pool.copy_pages([2], [5])
    assert torch.equal(pool.gather(1, 0, torch.tensor([5])), pool.gather(1, 0, torch.tensor([2])))


def test_the_option_is_checked_where_it_cannot_be_read():
    EngineConfig(kv_dtype="bfloat16").validate()                          # CPU, torch backend
    with pytest.raises(ValueError, match=r"kv_dtype 'bfloat16' is read by the torch attention "
                                         r"backend only .* got 'triton'"):
        check_kv_dtype_support("bfloat16", torch.device("cpu"), "triton")
    with pytest.raises(ValueError, match=r"kv_dtype must be one of \['auto', 'bfloat16', "):
        EngineConfig(kv_dtype="bf16").validate()


@pytest.fixture(scope="module")
def gguf_path():
    from agentlang.runtime.weights.model_loader import resolve_model

    return resolve_model("default", "auto").path


@pytest.mark.slow
def test_the_embedded_gguf_on_a_bfloat16_cache(gguf_path):
    """Batched, alone, from a warm cache and in 8-token prefill chunks: the same tokens and
    logprobs, to the bit; the pool holds twice the tokens of a float32 one in the same budget."""
    from agentlang.runtime import Engine, SamplingParams

    prompts = ["The history of the city of Rome began", "def fibonacci(n):",
               "Summarize: " + "the cat sat on the mat and looked at the dog. " * 40]
    sp = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=0)

    def lps(outs):
        return [[lp.logprob for lp in o.outputs[0].logprobs] for o in outs]

    eng = Engine(gguf_path, weights="auto", kv_budget_mb=64, kv_dtype="bfloat16")
    full = Engine(gguf_path, weights="auto", kv_budget_mb=64)
    try:
        assert eng.pool.buffer.dtype == torch.bfloat16
        assert eng.pool.capacity_tokens == 2 * full.pool.capacity_tokens
        batched = eng.generate(prompts, sp)
        alone = [eng.generate(p, sp) for p in prompts]
        warm = [eng.generate(p, sp) for p in prompts]
        assert warm[-1].meta["cached_tokens"] > 400
    finally:
        full.shutdown()
        eng.shutdown()
    eng = Engine(gguf_path, weights="auto", kv_budget_mb=64, kv_dtype="bfloat16",
                 max_batch_tokens=8)
    try:
        cut = [eng.generate(p, sp) for p in prompts]
    finally:
        eng.shutdown()
    for runs in (alone, warm, cut):
        assert [o.token_ids for o in runs] == [o.token_ids for o in batched]
        assert lps(runs) == lps(batched)


@pytest.mark.slow
def test_next_tokens_agree_with_the_float32_cache(gguf_path, bench):
    """Teacher-forced on the embedded GGUF (float32 activations, the native layer): the
    bfloat16 cache's next token is the float32 cache's nearly everywhere, its KL tiny."""
    from agentlang.runtime import Engine

    eng = Engine(gguf_path, weights="auto", num_pages=8)
    model, tok = eng.model, eng.tokenizer
    assert model.native_decoder is not None
    prompts = [tok.encode(p) for p in (
        "The capital of France is",
        "Once upon a time, in a small village at the edge of a great forest, there lived",
        "import numpy as np\n\ndef softmax(x):",
        "Q: What is the boiling point of water at sea level in Celsius?\nA:")]
    try:
        r = bench.teacher_forced(model, prompts, ("bfloat16",), positions=32)["bfloat16"]
    finally:
        eng.shutdown()
    print(f"\nbf16 KV vs fp32 KV, {r['positions']} positions: top-1 "
          f"{100 * r['top1_agreement']:.2f}%, mean KL {r['kl_mean']:.6f}")
    assert r["positions"] == 128
    assert r["top1_agreement"] >= 0.98
    assert 0 < r["kl_mean"] < 1e-3
