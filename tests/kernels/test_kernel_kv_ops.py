"""KV store and page copy kernels vs their references (bitwise), under the interpreter."""

from __future__ import annotations

import pytest
import torch

from agentlang.kernels import copy_pages, copy_pages_ref, store_kv, store_kv_ref


@pytest.mark.parametrize(
    "page_size,heads,head_dim,src_dtype,cache_dtype",
    [
        (1, 3, 64, torch.float32, torch.float32),
        (16, 2, 128, torch.float32, torch.bfloat16),   # converts on store, rounding like torch
        (32, 8, 64, torch.bfloat16, torch.bfloat16),
        (16, 3, 80, torch.float16, torch.float32),
    ],
)
def test_store_kv_writes_exactly_the_slots(page_size, heads, head_dim, src_dtype, cache_dtype):
    g = torch.Generator().manual_seed(page_size + heads)
    P, T = 13, 13
    shape = (P, page_size, heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(cache_dtype)
    v_cache = torch.randn(shape, generator=g).to(cache_dtype)
    slots = torch.randperm(P * page_size, generator=g)[:T]
    # k is a head slice of a fused projection: row stride larger than heads*head_dim
    fused = torch.randn(T, 3 * heads, head_dim, generator=g).to(src_dtype)
    k, v = fused[:, :heads], fused[:, heads: 2 * heads]
    want_k, want_v = store_kv_ref(k, v, k_cache, v_cache, slots)
    store_kv(k, v, k_cache, v_cache, slots)
    if src_dtype == cache_dtype or cache_dtype == torch.float32:
        assert torch.equal(k_cache, want_k)
        assert torch.equal(v_cache, want_v)
    else:
        # The interpreter narrows fp32 -> bf16 by truncation (a GPU rounds to nearest even like
        # torch): the stored values are within one bf16 ulp of torch's, untouched slots equal.
        ulp = torch.finfo(cache_dtype).eps
        for got, want in ((k_cache, want_k), (v_cache, want_v)):
            diff = (got.double() - want.double()).abs()
            assert (diff <= ulp * want.double().abs()).all()
            untouched = torch.ones(P * page_size, dtype=torch.bool)
            untouched[slots] = False
            assert torch.equal(got.view(P * page_size, -1)[untouched],
                               want.view(P * page_size, -1)[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16, 32])
def test_copy_pages_all_layers_bitwise(page_size, dtype):
    g = torch.Generator().manual_seed(page_size)
    L, P, H, D = 3, 9, 2, 64
    buf = torch.randn(L, 2, P, page_size, H, D, generator=g).to(dtype)
    src = torch.tensor([4, 0, 7], dtype=torch.int64)
    dst = torch.tensor([1, 8, 2], dtype=torch.int64)
    want = copy_pages_ref(buf, src, dst)
    copy_pages(buf, src, dst)
    assert torch.equal(buf, want)
    assert torch.equal(buf[:, :, 1], buf[:, :, 4]) and torch.equal(buf[:, :, 8], buf[:, :, 0])
