"""Quantized KV cache: format error bounds, the pool's store/gather/copy, memory accounting,
kv_dtype validation at engine start, precision-keyed prefix cache, and int8 quality on the
embedded model (teacher-forced top-1 agreement with the full-precision cache)."""

from __future__ import annotations

import pytest
import torch

from agentlang.runtime.engine.config import EngineConfig
from agentlang.runtime.models.kv_plan import describe_engine
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.cache.kv_quant import (
    KV_DTYPES,
    SCALE_MIN,
    check_kv_dtype_support,
    dequantize,
    kv_format,
    quantize,
)
from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.cache.radix_cache import RadixCache

QUANT = ["int8", "fp8_e4m3", "fp8_e5m2"]
# not the bench's prompt set (bench/data/kv_quant_prompts.json)
AGREEMENT_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woodcutter and his three children. Every morning he",
    "import numpy as np\n\ndef softmax(x):",
    "Q: What is the boiling point of water at sea level in Celsius?\nA:",
]
# half a step of the row's largest magnitude: absolute for int8, relative (half an ulp) for fp8
HALF_STEP = {"int8": 0.5 / 127, "fp8_e4m3": 2**-4, "fp8_e5m2": 2**-3}


@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16])
def test_round_trip_error_bound(name, src_dtype):
    fmt = kv_format(name)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(48, 3, 64, generator=g) * torch.logspace(-6, 4, 48)[:, None, None])
    x = x.to(src_dtype)
    q, s = quantize(x, fmt)
    assert q.dtype == fmt.storage and s.dtype == torch.float16 and s.shape == (48, 3)
    back = dequantize(q, s, torch.float32)
    err = (back.double() - x.double()).abs().amax(-1)
    # rows below qmax * 2**-14 use the smallest (clamped) scale; 2**-10 covers the fp16 scale
    ref = x.double().abs().amax(-1).clamp(min=fmt.qmax * SCALE_MIN)
    assert (err <= ref * HALF_STEP[name] * (1 + 2**-10)).all()
    assert (err > ref * HALF_STEP[name] / 4).any()      # lossy as expected
    # each row's largest element lands on (about) the format's largest magnitude, unless the
    # row is so small that its scale is clamped
    big = x.double().abs().amax(-1) > 2 * fmt.qmax * SCALE_MIN
    assert big.sum() >= 20
    assert (q.float().abs().amax(-1)[big] >= fmt.qmax * (1 - 2**-3)).all()


def test_zero_rows_and_dtype_of_dequantize():
    fmt = kv_format("int8")
    q, s = quantize(torch.zeros(2, 5, 8), fmt)
    assert (q == 0).all() and (s.float() == SCALE_MIN).all()
    assert dequantize(q, s, torch.bfloat16).dtype == torch.bfloat16


def test_bytes_per_token_counts_storage_and_scales():
    # SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64
    fp32 = KVLayout(30, 3, 64, torch.float32)
    bf16 = KVLayout(30, 3, 64, torch.bfloat16)
    assert fp32.bytes_per_token() == 30 * 2 * 3 * 64 * 4 == 46080
    assert bf16.bytes_per_token() == 23040
    for name in QUANT:
        q = KVLayout(30, 3, 64, torch.float32, name)
        assert q.bytes_per_token() == 30 * 2 * 3 * (64 + 2) == 11880   # + one fp16 scale
        assert q.bytes_per_token() <= 0.53 * bf16.bytes_per_token()
        assert q.kv_dtype_name == name and q.quantized
    assert fp32.kv_dtype_name == "float32" and not fp32.quantized


@pytest.mark.parametrize("name", QUANT)
def test_pool_store_gather_copy(name):
    layout = KVLayout(2, 3, 16, torch.float32, name)
    pool = KVPool(layout, page_size=4, num_pages=6)
    assert pool.buffer.dtype == kv_format(name).storage
    assert pool.scales.shape == (2, 2, 6, 4, 3) and pool.scales.dtype == torch.float16
    assert pool.nbytes() == 6 * 4 * layout.bytes_per_token()
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(2, 7, 3, 16, generator=g) * 5
    slots = torch.tensor([9, 10, 11, 12, 13, 2, 3])        # pages 2, 3 and the end of page 0
    pool.store(1, slots, k, v)
    fmt = kv_format(name)
    for which, x in ((0, k), (1, v)):
        got = pool.gather(1, which, torch.tensor([[2, 3], [0, 0]]))   # [2, 2, S, H, D]
        assert got.shape == (2, 2, 4, 3, 16) and got.dtype == torch.float32
        flat = got[0].flatten(0, 1)                                  # slots 8..15
        want = dequantize(*quantize(x, fmt), torch.float32)
        assert torch.equal(flat[1:6], want[:5])
        assert torch.equal(got[1, 0, 2:], want[5:])
        err = (flat[1:6] - x[:5]).abs().amax(-1)                          # and close to x
        assert (err <= x[:5].abs().amax(-1) * HALF_STEP[name] * (1 + 2**-10)).all()
    assert (pool.gather(0, 0, torch.tensor([2])) == 0).all()          # other layer untouched
    pool.copy_pages([2], [5])
    assert torch.equal(pool.gather(1, 0, torch.tensor([5])), pool.gather(1, 0, torch.tensor([2])))
    assert torch.equal(pool.scales[:, :, 5], pool.scales[:, :, 2])


def test_pool_sized_from_budget_with_scales():
    layout = KVLayout(30, 3, 64, torch.float32, "int8")
    pool = KVPool(layout, page_size=16, budget_mb=8)
    assert pool.num_pages == 8 * 2**20 // (11880 * 16) == 44
    assert pool.nbytes() <= 8 * 2**20


def test_unknown_kv_dtype_is_rejected_with_the_accepted_values():
    for bad in ("int4", "fp16", "float8", ""):
        with pytest.raises(ValueError, match=r"kv_dtype must be one of \['auto', 'bfloat16', "
                                             r"'int8', 'fp8_e4m3', 'fp8_e5m2'\]"):
            EngineConfig(kv_dtype=bad).validate()
        with pytest.raises(ValueError, match="kv_dtype must be one of"):
            KVLayout(1, 1, 8, torch.float32, bad)
    assert KV_DTYPES == ("auto", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2")


def test_engine_start_fails_fast_on_bad_kv_dtype():
    from agentlang.runtime import Engine

    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        Engine(kv_dtype="int3")


def test_dtype_the_device_cannot_hold(monkeypatch):
    from agentlang.runtime import Engine

    monkeypatch.delattr(torch, "float8_e5m2")
    with pytest.raises(ValueError, match=r"needs torch\.float8_e5m2, which torch .* does not "
                                         "provide"):
        Engine(kv_dtype="fp8_e5m2")
    # a device that cannot run the casts (here: CUDA on a CPU-only build, or no GPU)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="kv_dtype 'int8' is not supported on device cuda"):
            EngineConfig(kv_dtype="int8", device="cuda", attention_backend="torch").validate()


def test_fp8_e4m3_needs_sm89_for_triton(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="compute capability >= 8.9"):
        check_kv_dtype_support("fp8_e4m3", torch.device("cuda"), "auto")


def test_prefix_cached_at_one_precision_misses_at_another():
    alloc = PageAllocator(8)
    cache = RadixCache(alloc, page_size=4)
    ns_int8 = ("m", "torch.float32", "int8")
    ns_fp32 = ("m", "torch.float32", "float32")
    tokens = list(range(12))
    pages = alloc.allocate(3)
    cache.insert(tokens, pages, ns_int8)
    assert cache.match_prefix(tokens, ns_int8).length == 12
    assert cache.match_prefix(tokens, ns_fp32).length == 0
    assert cache.match_prefix(tokens, ("m", "torch.float32", "fp8_e4m3")).length == 0
    cache.check_integrity()


@pytest.fixture(scope="module")
def int8_engine():
    from agentlang.runtime import Engine

    eng = Engine(kv_dtype="int8", num_pages=64, page_size=16, weights="dense")  # fp32 weights
    yield eng
    eng.shutdown()


@pytest.mark.slow
def test_engine_int8_pool_namespace_and_description(int8_engine):
    from agentlang.runtime import Engine, SamplingParams

    eng = int8_engine
    assert eng.pool.buffer.dtype == torch.int8 and eng.pool.scales is not None
    assert eng.namespace_base[-1] == "int8"
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    out = eng.generate(prompt, SamplingParams(max_tokens=4, temperature=0))
    assert len(out.token_ids) == 4
    ids = eng.tokenizer.encode(prompt)
    assert eng.cache.match_prefix(ids, eng.namespace_base, record=False).length >= 16
    # an engine with the model-dtype cache has a different namespace: a miss in this tree
    full = Engine(num_pages=64, page_size=16, weights="dense")
    try:
        assert full.namespace_base == (eng.namespace_base[0], "torch.float32", "float32")
        assert eng.cache.match_prefix(ids, full.namespace_base, record=False).length == 0
        ref = full.generate(prompt, SamplingParams(max_tokens=4, temperature=0))
        assert ref.meta["cached_tokens"] == 0
    finally:
        full.shutdown()
    info = describe_engine(eng, context=4096)
    assert info["kv_dtype"] == "int8" and info["kv_bytes_per_token"] == 11880
    assert info["kv_pool_bytes"] == eng.pool.nbytes() == 64 * 16 * 11880
    assert info["max_concurrent_requests"] == 64 // 256 == 0
    # float32 weights; where oneDNN packs the linears (runtime/models/packed_linear.py), the tied
    # LM head is one more 49152 x 576 table
    from agentlang.runtime.models.packed_linear import packs
    extra = 49152 * 576 if packs(torch.float32) else 0
    assert info["weights_bytes"] == (134515008 + extra) * 4


@pytest.mark.slow
def test_int8_top1_agreement_teacher_forced(int8_engine, bench):
    model, tok = int8_engine.model, int8_engine.tokenizer
    prompts = [tok.encode(p) for p in AGREEMENT_PROMPTS]
    res = bench.teacher_forced(model, prompts, ("int8",), positions=32)
    r = res["int8"]
    print(f"\nint8 KV vs fp32 KV, {r['positions']} teacher-forced positions: top-1 agreement "
          f"{100 * r['top1_agreement']:.2f}%, mean KL {r['kl_mean']:.5f}")
    assert r["positions"] == 128
    assert r["top1_agreement"] >= 0.95
    assert 0 < r["kl_mean"] < 0.01


@pytest.mark.slow
def test_bench_perplexity_and_memory_table(int8_engine, bench):
    model = int8_engine.model
    ids = int8_engine.tokenizer.encode(bench.load_text())[:70]
    full = bench.perplexity(model, ids, "auto", chunk=32)
    assert full == pytest.approx(bench.perplexity(model, ids, "auto", chunk=128), rel=1e-4)
    int8 = bench.perplexity(model, ids, "int8", chunk=32)
    assert 1 < full < 1000 and int8 != full and int8 == pytest.approx(full, rel=0.02)
    rows = {r["kv_dtype"]: r for r in bench.memory_table(model)}
    assert rows["int8"]["bytes_per_token"] == 11880 and rows["int8"]["ratio_vs_bf16"] <= 0.53
    assert rows["bfloat16"]["requests_4k_in_budget"] == 4 * 2**30 // (23040 * 4096) == 45
    assert rows["int8"]["requests_4k_in_budget"] == 88
