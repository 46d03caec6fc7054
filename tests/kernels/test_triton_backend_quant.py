"""Quantized pools through both attention backends: the Triton store writes the same bytes and
scales as the torch path (``KVPool.store``), and attention over them agrees, for a prefill, a
mixed step, a decode step and copy-on-write page copies."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import rel_err

from agentlang.runtime.attention.base import make_backend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool

HQ, HKV, D, LAYERS = 6, 2, 64, 1


def _same_pools(a: KVPool, b: KVPool) -> bool:
    return torch.equal(a.buffer.view(torch.uint8), b.buffer.view(torch.uint8)) and torch.equal(
        a.scales, b.scales)


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_quantized_pool_triton_matches_torch(kv_dtype):
    page_size = 16
    gen = torch.Generator().manual_seed(3)
    layout = KVLayout(LAYERS, HKV, D, torch.float32, kv_dtype)
    pools = [KVPool(layout, page_size, num_pages=8) for _ in range(2)]
    backends = [make_backend("torch", torch.device("cpu")),
                make_backend("triton", torch.device("cpu"))]
    order = torch.randperm(8, generator=gen).tolist()
    tables = [order[0:3], order[3:5]]          # a: up to 48 tokens, b: up to 32

    def step(new_lens, prefix_lens):
        batch = build_forward_batch([[1] * n for n in new_lens], prefix_lens, tables, page_size)
        T = batch.num_tokens
        for layer in range(LAYERS):
            k = torch.randn(T, HKV, D, generator=gen) * 3
            v = torch.randn(T, HKV, D, generator=gen)
            q = torch.randn(T, HQ, D, generator=gen)
            outs = []
            for be, pool in zip(backends, pools):
                be.store_kv(pool, layer, k, v, batch)
                outs.append(be.attend(q, pool, layer, batch, D**-0.5))
            assert _same_pools(*pools)
            assert rel_err(outs[1], outs[0]) <= 1e-5
        return batch

    assert not step([20, 5], [0, 0]).is_decode
    assert not step([1, 9], [20, 5]).is_decode
    assert step([1, 1], [21, 14]).is_decode
    for be, pool in zip(backends, pools):
        be.copy_pages(pool, [tables[0][0]], [order[7]])
    assert _same_pools(*pools)
    assert torch.equal(pools[1].scales[:, :, order[7]], pools[1].scales[:, :, tables[0][0]])


@pytest.mark.slow
def test_engine_int8_greedy_triton_equals_torch(tiny_llama_dir):
    from agentlang.runtime import Engine, SamplingParams

    prompt = ("The quick brown fox jumps over the lazy dog because it wanted to see what was on "
              "the other side of the hill, and the dog")
    params = SamplingParams(max_tokens=6, temperature=0)
    results = {}
    for backend in ("torch", "triton"):
        eng = Engine(model=str(tiny_llama_dir), attention_backend=backend, device="cpu",
                     page_size=16, num_pages=32, kv_dtype="int8")
        assert eng.pool.buffer.dtype == torch.int8
        outs = [eng.generate(prompt, params), eng.generate(prompt + " did not care", params)]
        assert outs[1].meta["cached_tokens"] >= 16      # decode/extend over cached int8 pages
        results[backend] = [o.token_ids for o in outs]
        eng.shutdown()
    assert all(len(t) == 6 for t in results["torch"])
    assert results["triton"] == results["torch"]
