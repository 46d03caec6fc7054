"""TritonAttentionBackend vs TorchAttentionBackend on the same ForwardBatch and pool contents:
prefill, a mixed decode + extend step, a pure decode step, copy-on-write page copies."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import rel_err

from agentlang.runtime.attention.base import make_backend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool

HQ, HKV, D, LAYERS = 6, 2, 64, 2


def _step(backends, pools, new_tokens, prefix_lens, tables, page_size, gen):
    batch = build_forward_batch(new_tokens, prefix_lens, tables, page_size)
    T = batch.num_tokens
    for layer in range(LAYERS):
        k = torch.randn(T, HKV, D, generator=gen)
        v = torch.randn(T, HKV, D, generator=gen)
        q = torch.randn(T, HQ, D, generator=gen)
        outs = []
        for be, pool in zip(backends, pools):
            be.store_kv(pool, layer, k, v, batch)
            outs.append(be.attend(q, pool, layer, batch, D**-0.5, k, v))  # as the model calls it
        assert torch.equal(pools[0].buffer, pools[1].buffer)
        assert not outs[1].isnan().any()
        assert rel_err(outs[1], outs[0]) <= 1e-5
        # the new tokens' K/V read from k, v or from the pool: bitwise the same
        assert torch.equal(outs[1], backends[1].attend(q, pools[1], layer, batch, D**-0.5))
    return batch


@pytest.mark.parametrize("page_size", [1, 16])
def test_triton_backend_matches_torch_backend(page_size):
    gen = torch.Generator().manual_seed(page_size)
    layout = KVLayout(num_layers=LAYERS, num_kv_heads=HKV, head_dim=D, dtype=torch.float32)
    pools = [KVPool(layout, page_size, num_pages=160 // page_size + 4) for _ in range(2)]
    backends = [make_backend("torch", torch.device("cpu")), make_backend("triton", torch.device("cpu"))]
    assert [b.name for b in backends] == ["torch", "triton"]
    P = pools[0].num_pages
    order = torch.randperm(P, generator=gen).tolist()
    # a: 20 then 21 tokens, b: 5 then 12, c: 3 then 4 (all page tables shuffled)
    need = {"a": 40, "b": 30, "c": 10}
    tables, i = {}, 0
    for name, n in need.items():
        k = -(-n // page_size)
        tables[name] = order[i: i + k]
        i += k
    tok = lambda n: torch.randint(0, 100, (n,), generator=gen).tolist()  # noqa: E731

    b1 = _step(backends, pools, [tok(20), tok(5)], [0, 0], [tables["a"], tables["b"]],
               page_size, gen)
    assert not b1.is_decode
    # mixed: a decodes, b extends by 7, c arrives with 3 tokens
    b2 = _step(backends, pools, [tok(1), tok(7), tok(3)], [20, 5, 0],
               [tables["a"], tables["b"], tables["c"]], page_size, gen)
    assert not b2.is_decode
    b3 = _step(backends, pools, [tok(1), tok(1), tok(1)], [21, 12, 3],
               [tables["a"], tables["b"], tables["c"]], page_size, gen)
    assert b3.is_decode

    src, dst = [tables["a"][0], tables["b"][0]], [order[-1], order[-2]]
    for be, pool in zip(backends, pools):
        be.copy_pages(pool, src, dst)
    assert torch.equal(pools[0].buffer, pools[1].buffer)
    assert torch.equal(pools[1].buffer[:, :, dst[0]], pools[1].buffer[:, :, src[0]])


def test_triton_backend_rejects_batch_outside_pool():
    layout = KVLayout(num_layers=1, num_kv_heads=HKV, head_dim=D, dtype=torch.float32)
    pool = KVPool(layout, 16, num_pages=2)
    be = make_backend("triton", torch.device("cpu"))
    batch = build_forward_batch([[1, 2, 3]], [0], [[5]], 16)  # page 5 of a 2-page pool
    k = torch.zeros(3, HKV, D)
    with pytest.raises(ValueError, match="slot_mapping must lie in"):
        be.store_kv(pool, 0, k, k, batch)
    with pytest.raises(ValueError, match="page_size"):
        be.attend(torch.zeros(3, HQ, D), KVPool(layout, 32, num_pages=2), 0, batch, 0.1)
