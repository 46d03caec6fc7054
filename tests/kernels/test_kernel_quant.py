"""8-bit KV caches (int8, fp8 e4m3/e5m2) in the kernels, under the interpreter: the store
quantizes bit-exactly like its reference, decode/extend over quantized caches match their
float64 references, page copies carry the scales."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import make_case, rel_err

from agentlang.kernels import (
    copy_pages,
    copy_pages_ref,
    decode_attention,
    decode_attention_ref,
    extend_attention,
    extend_attention_ref,
    store_kv,
    store_kv_ref,
)
from agentlang.kernels._quant import SCALE_DTYPE, dequantize_ref, quantize_ref

QDTYPES = [torch.int8, torch.float8_e4m3fn, torch.float8_e5m2]
IDS = ["int8", "e4m3", "e5m2"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def quantize_cache(cache: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[P, S, H, D] float cache -> (8-bit cache, fp16 scales [P, S, H]); NaN (unused) slots get
    a NaN scale, so a kernel reading past a sequence's end still produces NaN."""
    q, s = quantize_ref(torch.nan_to_num(cache), dtype)
    s[cache.isnan().any(-1)] = float("nan")
    return q, s


@pytest.mark.parametrize("dtype", QDTYPES, ids=IDS)
@pytest.mark.parametrize("page_size,heads,head_dim", [(1, 3, 64), (16, 2, 80), (32, 8, 64)])
def test_store_quantizes_bit_exactly(dtype, page_size, heads, head_dim):
    g = torch.Generator().manual_seed(page_size + heads)
    P, T = 12, 11
    k_cache = torch.zeros(P, page_size, heads, head_dim).to(dtype)
    v_cache = torch.zeros_like(k_cache)
    k_scale = torch.full((P, page_size, heads), 7.0, dtype=SCALE_DTYPE)
    v_scale = k_scale.clone()
    slots = torch.randperm(P * page_size, generator=g)[:T]
    fused = torch.randn(T, 3 * heads, head_dim, generator=g)
    # magnitudes from 1e-7 (scale clamped at fp16's smallest normal) to 1e3, one all-zero row
    fused *= torch.logspace(-7, 3, T)[:, None, None]
    fused[0, :heads] = 0.0
    k, v = fused[:, :heads], fused[:, heads: 2 * heads]   # strided head slices
    want = store_kv_ref(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    store_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    for got, exp in zip((k_cache, v_cache, k_scale, v_scale), want):
        assert got.dtype == exp.dtype
        assert torch.equal(_bits(got), _bits(exp))
    # untouched slots keep their old scale
    untouched = torch.ones(P * page_size, dtype=torch.bool)
    untouched[slots] = False
    assert (k_scale.view(-1, heads)[untouched] == 7.0).all()


@pytest.mark.parametrize("dtype,qmax,bound", [(torch.int8, 127, 0.5 / 127),
                                              (torch.float8_e4m3fn, 448, 2**-4),
                                              (torch.float8_e5m2, 57344, 2**-3)], ids=IDS)
def test_quantization_error_bound(dtype, qmax, bound):
    # |x - x'| <= half a step at the row's largest magnitude (int8: steps are absolute), or half
    # an ulp of the row's largest value (fp8: steps are relative), plus the fp16 scale's
    # rounding; rows below qmax * 2**-14 use the clamped smallest scale.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, 128, generator=g) * torch.logspace(-6, 3, 64)[:, None, None]
    q, s = quantize_ref(x, dtype)
    err = (dequantize_ref(q, s) - x.double()).abs().amax(-1)
    absmax = x.double().abs().amax(-1).clamp(min=qmax * 2**-14)
    assert (err <= absmax * bound * (1 + 2**-10)).all()
    assert (err > absmax * bound / 4).any()   # lossy as expected: the test can fail


# (seq_lens, page_size, q_heads, kv_heads, head_dim, num_splits)
DECODE_CASES = [
    ([1, 37, 100], 16, 4, 4, 64, None),
    ([45, 1, 18], 1, 9, 3, 64, 3),
    ([70, 33], 32, 8, 2, 80, 4),
]


@pytest.mark.parametrize("dtype", QDTYPES, ids=IDS)
@pytest.mark.parametrize("seq_lens,S,hq,hkv,D,splits", DECODE_CASES)
def test_decode_quantized_matches_float64_reference(dtype, seq_lens, S, hq, hkv, D, splits):
    c = make_case(seq_lens, [1] * len(seq_lens), S, hq, hkv, D, seed=len(seq_lens) * S + D)
    kq, ks = quantize_cache(c.k_cache, dtype)
    vq, vs = quantize_cache(c.v_cache, dtype)
    out = torch.full_like(c.q, float("nan"))
    decode_attention(c.q, kq, vq, c.page_table, c.seq_lens, c.scale, out=out, num_splits=splits,
                     k_scale=ks, v_scale=vs)
    ref = decode_attention_ref(c.q, kq, vq, c.page_table, c.seq_lens, c.scale, ks, vs)
    assert rel_err(out, ref) <= 1e-5
    # and the quantized cache stays close to the full-precision attention
    full = decode_attention_ref(c.q, c.k_cache, c.v_cache, c.page_table, c.seq_lens, c.scale)
    assert rel_err(ref, full) <= (0.02 if dtype == torch.int8 else 0.15)


EXTEND_CASES = [
    ([7, 6, 57], [7, 1, 40], 16, 4, 4, 64),
    ([53, 1], [50, 1], 1, 9, 3, 64),
    ([40, 19], [33, 2], 32, 8, 2, 80),
]


@pytest.mark.parametrize("dtype", QDTYPES, ids=IDS)
@pytest.mark.parametrize("seq_lens,ext,S,hq,hkv,D", EXTEND_CASES)
def test_extend_quantized_matches_float64_reference(dtype, seq_lens, ext, S, hq, hkv, D):
    c = make_case(seq_lens, ext, S, hq, hkv, D, seed=sum(seq_lens) + S)
    kq, ks = quantize_cache(c.k_cache, dtype)
    vq, vs = quantize_cache(c.v_cache, dtype)
    out = torch.full_like(c.q, float("nan"))
    args = (c.q, kq, vq, c.page_table, c.q_start_loc, c.prefix_lens, c.seq_lens, c.scale)
    extend_attention(*args, out=out, k_scale=ks, v_scale=vs)
    assert rel_err(out, extend_attention_ref(*args, ks, vs)) <= 1e-5


@pytest.mark.parametrize("dtype", QDTYPES, ids=IDS)
def test_copy_pages_copies_scales(dtype):
    g = torch.Generator().manual_seed(2)
    L, P, S, H, D = 2, 6, 4, 2, 64
    buf, scales = quantize_ref(torch.randn(L, 2, P, S, H, D, generator=g), dtype)
    src = torch.tensor([4, 0], dtype=torch.int64)
    dst = torch.tensor([1, 5], dtype=torch.int64)
    want_buf, want_scales = copy_pages_ref(buf, src, dst, scales)
    copy_pages(buf, src, dst, scales=scales)
    assert torch.equal(_bits(buf), _bits(want_buf)) and torch.equal(scales, want_scales)
    assert torch.equal(scales[:, :, 1], scales[:, :, 4])
    assert not torch.equal(scales[:, :, 1], scales[:, :, 0])


def test_quantized_caches_need_their_scales():
    c = make_case([20], [1], 16, 4, 2, 64)
    kq, ks = quantize_cache(c.k_cache, torch.int8)
    vq, vs = quantize_cache(c.v_cache, torch.int8)
    with pytest.raises(ValueError, match="k_scale is required"):
        decode_attention(c.q, kq, vq, c.page_table, c.seq_lens, c.scale)
    with pytest.raises(ValueError, match="v_scale is only for an 8-bit"):
        decode_attention(c.q, c.k_cache, c.v_cache, c.page_table, c.seq_lens, c.scale,
                         v_scale=vs)
    with pytest.raises(ValueError, match="k_scale must have shape"):
        decode_attention(c.q, kq, vq, c.page_table, c.seq_lens, c.scale, k_scale=ks[:, :8],
                         v_scale=vs)
    with pytest.raises(ValueError, match="k_scale must be torch.float16"):
        extend_attention(c.q, kq, vq, c.page_table, c.q_start_loc, c.prefix_lens, c.seq_lens,
                         c.scale, k_scale=ks.float(), v_scale=vs)
    k = torch.zeros(1, 2, 64)
    with pytest.raises(ValueError, match="k_scale is required"):
        store_kv(k, k, kq, vq, torch.tensor([0]))
    buf = torch.zeros(1, 2, 3, 16, 2, 64, dtype=torch.int8)
    with pytest.raises(ValueError, match="scales is required"):
        copy_pages(buf, torch.tensor([0]), torch.tensor([1]))
