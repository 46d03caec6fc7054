"""Decode and extend attention kernels vs their float64 references, under the interpreter."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import make_case, rel_err

from agentlang.kernels import (
    LaunchConfig,
    choose_num_splits,
    decode_attention,
    decode_attention_ref,
    extend_attention,
    extend_attention_ref,
)

# (seq_lens, page_size, q_heads, kv_heads, head_dim, num_splits)
DECODE_CASES = [
    ([1, 37, 100], 16, 4, 4, 64, None),       # GQA 1, length 1, non-multiples of the page size
    ([45, 1, 18], 1, 9, 3, 64, 3),            # page size 1, GQA 3 (SmolLM2 heads)
    ([70, 33], 32, 8, 2, 128, 4),             # GQA 4, head_dim 128
    ([5, 64, 17], 16, 8, 1, 64, 2),           # MQA (GQA 8)
    ([130], 16, 6, 2, 128, 8),                # more splits, some of them empty
    ([3, 2], 32, 4, 1, 64, 7),                # splits >> tokens: most splits empty
    ([50, 9], 16, 6, 2, 80, 2),               # head_dim 80 (padded to 128)
    ([90, 1, 31, 64], 16, 12, 4, 64, None),   # default split choice
]


@pytest.mark.parametrize("seq_lens,S,hq,hkv,D,splits", DECODE_CASES)
def test_decode_matches_float64_reference(seq_lens, S, hq, hkv, D, splits):
    c = make_case(seq_lens, [1] * len(seq_lens), S, hq, hkv, D, seed=len(seq_lens) * S + D)
    out = torch.full_like(c.q, float("nan"))
    args = (c.q, c.k_cache, c.v_cache, c.page_table, c.seq_lens, c.scale)
    decode_attention(*args, out=out, num_splits=splits)
    assert rel_err(out, decode_attention_ref(*args)) <= 1e-5


# (seq_lens, extend_lens, page_size, q_heads, kv_heads, head_dim)
EXTEND_CASES = [
    ([7, 6, 57], [7, 1, 40], 16, 4, 4, 64),     # prefill, decode row, prefix-cache hit
    ([53, 1], [50, 1], 1, 9, 3, 64),            # page size 1, GQA 3
    ([34, 70], [1, 70], 32, 8, 2, 128),         # GQA 4, head_dim 128
    ([40, 19], [33, 2], 16, 8, 1, 64),          # MQA, extends crossing query blocks
    ([49], [33], 16, 6, 2, 80),                 # head_dim 80 (padded to 128)
]


@pytest.mark.parametrize("seq_lens,ext,S,hq,hkv,D", EXTEND_CASES)
def test_extend_matches_float64_reference(seq_lens, ext, S, hq, hkv, D):
    c = make_case(seq_lens, ext, S, hq, hkv, D, seed=sum(seq_lens) + S)
    out = torch.full_like(c.q, float("nan"))
    args = (c.q, c.k_cache, c.v_cache, c.page_table, c.q_start_loc, c.prefix_lens, c.seq_lens,
            c.scale)
    extend_attention(*args, out=out)
    assert rel_err(out, extend_attention_ref(*args)) <= 1e-5


# small tiles, so query blocks split a sequence's tokens (and, packed, a token's query group)
# and key blocks split pages: every boundary case of the block loops is crossed
EXTEND_CONFIGS = [
    LaunchConfig(block_m=16, block_n=16, num_warps=4, num_stages=2),
    LaunchConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, pack_gqa=True),
    LaunchConfig(block_m=32, block_n=64, num_warps=4, num_stages=3, pack_gqa=True),
]


@pytest.mark.parametrize("config", EXTEND_CONFIGS, ids=lambda c: c.label().replace(" ", "-"))
@pytest.mark.parametrize("seq_lens,ext,S,hq,hkv,D", EXTEND_CASES)
def test_extend_launch_configs_match_float64_reference(seq_lens, ext, S, hq, hkv, D, config):
    c = make_case(seq_lens, ext, S, hq, hkv, D, seed=sum(seq_lens) + S + 1)
    out = torch.full_like(c.q, float("nan"))
    args = (c.q, c.k_cache, c.v_cache, c.page_table, c.q_start_loc, c.prefix_lens, c.seq_lens,
            c.scale)
    extend_attention(*args, out=out, config=config)
    assert rel_err(out, extend_attention_ref(*args)) <= 1e-5


def test_extend_zero_length_sequence_and_strided_q():
    # q is a head slice of a fused [T, Hq+2Hkv, D] projection (row stride != Hq*D);
    # the middle sequence appends nothing this step.
    c = make_case([20, 9, 12], [20, 0, 3], 16, 4, 2, 64, seed=7)
    fused = torch.randn(c.q.shape[0], 8, 64)
    fused[:, :4] = c.q
    q = fused[:, :4]
    out = torch.full_like(c.q, float("nan"))
    args = (q, c.k_cache, c.v_cache, c.page_table, c.q_start_loc, c.prefix_lens, c.seq_lens,
            c.scale)
    extend_attention(*args, out=out)
    assert rel_err(out, extend_attention_ref(*args)) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_upcast(dtype):
    # fp16/bf16 inputs are upcast after each load: with an fp32 output the only error left is
    # fp32 arithmetic; with an output in the input dtype, one rounding of the result.
    c = make_case([33, 1, 17], [1, 1, 1], 16, 8, 2, 64, dtype=dtype, seed=3)
    args = (c.q, c.k_cache, c.v_cache, c.page_table, c.seq_lens, c.scale)
    ref = decode_attention_ref(*args)
    out32 = torch.full(c.q.shape, float("nan"), dtype=torch.float32)
    decode_attention(*args, out=out32, num_splits=2)
    assert rel_err(out32, ref) <= 1e-5
    out = decode_attention(*args)
    assert out.dtype == dtype
    assert rel_err(out, ref) <= torch.finfo(dtype).eps

    e = make_case([40, 9], [25, 9], 16, 8, 2, 64, dtype=dtype, seed=4)
    eargs = (e.q, e.k_cache, e.v_cache, e.page_table, e.q_start_loc, e.prefix_lens, e.seq_lens,
             e.scale)
    out32 = torch.full(e.q.shape, float("nan"), dtype=torch.float32)
    extend_attention(*eargs, out=out32)
    assert rel_err(out32, extend_attention_ref(*eargs)) <= 1e-5


def test_native_fp16_dots():
    # The GPU path for fp16/bf16: dot operands in the input dtype, fp32 accumulation; the
    # probabilities are rounded to fp16 before P@V, so the error is of fp16 size.
    c = make_case([50, 3], [1, 1], 16, 8, 2, 64, dtype=torch.float16, seed=5)
    args = (c.q, c.k_cache, c.v_cache, c.page_table, c.seq_lens, c.scale)
    out = torch.full(c.q.shape, float("nan"), dtype=torch.float32)
    decode_attention(*args, out=out, num_splits=2, precision="native")
    assert rel_err(out, decode_attention_ref(*args)) <= 2e-3
    e = make_case([40, 9], [25, 9], 16, 8, 2, 64, dtype=torch.float16, seed=6)
    eargs = (e.q, e.k_cache, e.v_cache, e.page_table, e.q_start_loc, e.prefix_lens, e.seq_lens,
             e.scale)
    out = torch.full(e.q.shape, float("nan"), dtype=torch.float32)
    extend_attention(*eargs, out=out, precision="native")
    assert rel_err(out, extend_attention_ref(*eargs)) <= 2e-3


def test_choose_num_splits():
    assert choose_num_splits(100, 1, 8, num_sms=132) == 1          # short context: no split
    assert choose_num_splits(32768, 1, 8, num_sms=132) == 64        # one long sequence: capped
    assert choose_num_splits(4096, 256, 8, num_sms=132) == 1        # batch fills the device
    assert choose_num_splits(4096, 4, 8, num_sms=132) == 16         # 4 waves of 132 SMs


def new_kv(c, poison: bool):
    """The new tokens' K/V [T, Hkv, D] gathered from the case's cache; ``poison`` then NaN-fills
    their slots in the cache, so a kernel that still read them there would return NaN."""
    S = c.k_cache.shape[1]
    slots = []
    for b in range(c.page_table.shape[0]):
        for pos in range(int(c.prefix_lens[b]), int(c.seq_lens[b])):
            slots.append(int(c.page_table[b, pos // S]) * S + pos % S)
    slots = torch.tensor(slots, dtype=torch.long)
    flat_k = c.k_cache.view(-1, *c.k_cache.shape[2:])
    flat_v = c.v_cache.view(-1, *c.v_cache.shape[2:])
    k_new, v_new = flat_k[slots].clone(), flat_v[slots].clone()
    if poison:
        flat_k[slots] = float("nan")
        flat_v[slots] = float("nan")
    return k_new, v_new


NEW_KV_CONFIGS = [
    None,                                                                 # interpreter default
    LaunchConfig(block_m=16, block_n=16, num_warps=4, num_stages=2),
    LaunchConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, tma=True),
    LaunchConfig(block_m=32, block_n=16, num_warps=4, num_stages=2, pack_gqa=True, tma=True),
]


@pytest.mark.parametrize("config", NEW_KV_CONFIGS,
                         ids=lambda c: "default" if c is None else c.label().replace(" ", "-"))
@pytest.mark.parametrize("seq_lens,ext,S,hq,hkv,D", EXTEND_CASES[:4] + [
    ([90, 33, 16], [41, 33, 16], 16, 4, 2, 64),  # prefixes 49 (block straddled), 0, 0
    ([50, 33, 16], [50, 33, 16], 16, 4, 2, 64),  # plain prefill: no page-table path compiled
])
def test_extend_reading_new_kv_equals_paged_path(seq_lens, ext, S, hq, hkv, D, config):
    # The new tokens' K/V read from contiguous rows: the same key blocks in the same order as
    # through the page table, so the result is bitwise the paged one; their pool slots are
    # NaN-poisoned first, so a read of them there would show. (A TMA tile is transposed for
    # the QK dot: the interpreter's numpy matmul then rounds differently, so there it is equal
    # to float rounding only.)
    c = make_case(seq_lens, ext, S, hq, hkv, D, seed=sum(seq_lens) + S + 2)
    args = (c.q, c.k_cache, c.v_cache, c.page_table, c.q_start_loc, c.prefix_lens, c.seq_lens,
            c.scale)
    ref = extend_attention_ref(*args)
    paged = extend_attention(*args, config=None if config is None else config._replace(tma=False))
    k_new, v_new = new_kv(c, poison=True)
    out = torch.full_like(c.q, float("nan"))
    # the tightest prefix bound: 0 (no sequence has a cached prefix) compiles no page-table path
    max_prefix = int(c.prefix_lens.max())
    extend_attention(*args, out=out, config=config, k_new=k_new, v_new=v_new,
                     max_prefix_len=max_prefix)
    assert rel_err(out, ref) <= 1e-5
    if config is not None and config.tma:
        assert rel_err(out, paged) <= 1e-6
    else:
        assert torch.equal(out, paged)


@pytest.mark.parametrize("q_scale", [1.0, 4.0, 30.0])
@pytest.mark.parametrize("new_kv_path", [False, True])
def test_extend_lazy_rescale(q_scale, new_kv_path):
    # Larger queries spread the logits: at 4x the row max keeps growing by less than the 2**8
    # threshold (the stale reference point is kept, probabilities above 1), at 30x it jumps past
    # it on many blocks (rescales); both must match the reference as the exact-max path does.
    c = make_case([90, 33, 70], [41, 33, 1], 16, 4, 2, 64, seed=11)
    q = c.q * q_scale
    args = (q, c.k_cache, c.v_cache, c.page_table, c.q_start_loc, c.prefix_lens, c.seq_lens,
            c.scale)
    ref = extend_attention_ref(*args)
    cfg = LaunchConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, lazy_rescale=True)
    extra = {}
    if new_kv_path:
        k_new, v_new = new_kv(c, poison=False)
        extra = dict(k_new=k_new, v_new=v_new, max_prefix_len=int(c.prefix_lens.max()))
    out = torch.full_like(q, float("nan"))
    extend_attention(*args, out=out, config=cfg, **extra)
    assert rel_err(out, ref) <= 1e-5
    # the option reaches the kernel: a stale reference point rounds differently
    exact = extend_attention(*args, config=cfg._replace(lazy_rescale=False), **extra)
    assert rel_err(exact, ref) <= 1e-5
    assert not torch.equal(out, exact)
