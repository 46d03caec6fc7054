"""Paged decode attention: one query token per sequence over its whole context, read through
the page table (PagedAttention), split along the context (flash-decoding).

Stage 1 runs one program per (sequence, KV head, split): it loads the group of query heads that
share the KV head once, walks its share of the context in blocks of ``BLOCK_N`` tokens (each
token's page looked up in the page table) with an online softmax, and writes a partial output
and its log-sum-exp. Stage 2 merges the splits. With one split, stage 1 writes the output
directly and stage 2 is skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentlang.kernels._common import (
    LaunchConfig,
    check_attention_inputs,
    check_launch_config,
    check_launchable,
    check_ranges,
    check_shape,
    check_tensor,
    checked_out,
    context_ref,
    next_pow2,
    page_table_checks,
    use_fp32_dot,
)
from agentlang.kernels._paged_block import online_softmax_step, paged_qk_block
from agentlang.kernels._quant import dequantize_ref, quant_spec

LOG2E = 1.4426950408889634
MIN_TOKENS_PER_SPLIT = 256
WAVES = 4  # programs per multiprocessor the split count aims for
MAX_SPLITS = 64


@triton.jit
def _decode_stage1(
    Q, K, V, KScale, VScale, PageTable, SeqLens, Out, MidO, MidLse,
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    num_splits,  # runtime value: a new split count does not recompile
    stride_qb, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_ksp, stride_kss, stride_kvh_s,  # k_scale [P, S, Hkv] (8-bit caches)
    stride_vsp, stride_vss, stride_vvh_s,
    stride_pt,
    stride_ob, stride_oh,
    stride_mb, stride_mh, stride_ms,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    DIRECT: tl.constexpr,  # one split: write the output, skip the merge
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_F32: tl.constexpr,
    QUANT: tl.constexpr,  # 8-bit cache: dequantize K/V with their per-token scales after load
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(SeqLens + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h                                              # [BLOCK_H]

    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :], other=0.0,
    )                                                                     # [BLOCK_H, BLOCK_D]

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + offs_n                                                       # [BLOCK_N]
        mask_n = n < end
        qk, page, v_off = paged_qk_block(
            q, Q, K, KScale, PageTable, b * stride_pt, n, mask_n, kvh, offs_d, mask_d,
            stride_kp, stride_ks, stride_kh, stride_ksp, stride_kss, stride_kvh_s,
            stride_vp, stride_vs, stride_vh, PAGE_SIZE, QUANT, DOT_F32,
        )
        qk = tl.where(mask_n[None, :], qk * qk_scale, float("-inf"))          # [BLOCK_H, BLOCK_N]

        m_i, l_i, acc = online_softmax_step(
            qk, m_i, l_i, acc, Q, V, VScale, v_off, page, n, kvh, offs_d, mask_n, mask_d,
            stride_vsp, stride_vss, stride_vvh_s, PAGE_SIZE, QUANT, DOT_F32,
        )

    # An empty split (short sequence) leaves l_i == 0: it writes o = 0 and lse = -inf.
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    mask_hd = mask_h[:, None] & mask_d[None, :]
    if DIRECT:
        tl.store(
            Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
            o.to(Out.dtype.element_ty), mask=mask_hd,
        )
    else:
        tl.store(
            MidO + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms + offs_d[None, :],
            o, mask=mask_hd,
        )
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(MidLse + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _decode_stage2(
    MidO, MidLse, Out,
    num_splits,
    stride_mb, stride_mh, stride_ms,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < num_splits
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(MidLse + b * stride_lb + h * stride_lh + offs_s, mask=mask_s,
                  other=float("-inf"))                                        # [BLOCK_S]
    o = tl.load(
        MidO + b * stride_mb + h * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :], other=0.0,
    )                                                                         # [BLOCK_S, BLOCK_D]
    w = tl.exp2(lse - tl.max(lse, 0))  # split 0 is never empty, so the max is finite
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty),
             mask=mask_d)


def choose_num_splits(max_seq_len: int, batch: int, kv_heads: int, num_sms: int,
                      waves: int = WAVES, min_tokens: int = MIN_TOKENS_PER_SPLIT) -> int:
    """Splits per sequence: enough programs for ``waves`` waves over ``num_sms``
    multiprocessors, but never under ``min_tokens`` context tokens per split, at most
    ``MAX_SPLITS``."""
    by_len = -(-max_seq_len // min_tokens)
    by_fill = -(-waves * num_sms // max(1, batch * kv_heads))
    return max(1, min(by_len, by_fill, MAX_SPLITS))


def default_decode_config(head_dim: int) -> LaunchConfig:
    """The launch the wrapper uses unless given one: the fastest of ``bench/kernels.py``'s sweep
    on an H200 for head_dim 64 and 128 (docs/benchmarks.md); larger head dims are untimed."""
    block_d = next_pow2(head_dim, 16)
    if block_d <= 64:
        return LaunchConfig(block_n=64, num_warps=2, num_stages=3)
    if block_d <= 128:
        return LaunchConfig(block_n=32, num_warps=2, num_stages=3)
    return LaunchConfig(block_n=32, num_warps=4, num_stages=2)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    *,
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    check_indices: bool = True,
    precision: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context.

    q: [B, Hq, D]; k_cache, v_cache: [P, S, Hkv, D] (Hq % Hkv == 0); page_table: [B, max_pages]
    int32, row b's first ceil(seq_lens[b]/S) entries are the pages of sequence b in order;
    seq_lens: [B] int32, 1 <= seq_lens[b] <= max_pages*S. Returns ``out`` [B, Hq, D] (allocated
    in q's dtype when not given). ``max_seq_len`` (host int, >= every seq_len) avoids a device
    sync when choosing ``num_splits``; ``check_indices=False`` skips the range checks of
    ``page_table``/``seq_lens`` (one sync) for callers that validated the same metadata already.
    An 8-bit cache (int8, float8; see :mod:`agentlang.kernels._quant`) needs ``k_scale, v_scale``
    [P, S, Hkv] float16; K/V are dequantized right after each load. ``config`` overrides the
    launch (:func:`default_decode_config`).
    """
    P, S, Hkv, group = check_attention_inputs(q, k_cache, v_cache, k_scale, v_scale)
    dev = q.device
    B, Hq, D = q.shape
    check_tensor("page_table", page_table, 2, (torch.int32,), dev, contiguous=True)
    if page_table.shape[0] != B:
        raise ValueError(f"page_table must have {B} rows (one per query), got {page_table.shape[0]}")
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,), dev, contiguous=True)
    check_shape("seq_lens", seq_lens, (B,))
    out = checked_out(out, q, sm_scale)
    check_launchable(_decode_stage1, dev)
    if B == 0:
        return out
    if check_indices:
        check_ranges(page_table_checks(page_table, seq_lens, P, S))
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    if num_splits is None:
        sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
        num_splits = choose_num_splits(max_seq_len, B, Hkv, sms)
    if not 1 <= num_splits <= 1024:
        raise ValueError(f"num_splits must be in [1, 1024], got {num_splits}")

    block_d = next_pow2(D, 16)
    cfg = check_launch_config(default_decode_config(D) if config is None else config)
    quant = quant_spec(k_cache.dtype) is not None
    # an 8-bit cache is dequantized to fp32 and enters the dots like a cache in q's dtype
    dot_f32 = use_fp32_dot(precision, _decode_stage1, q.dtype, q.dtype if quant else k_cache.dtype)
    ks = k_scale if quant else k_cache  # unused pointers when not quantized
    vs = v_scale if quant else v_cache
    if num_splits > 1:
        mid_o = torch.empty(B, Hq, num_splits, D, dtype=torch.float32, device=dev)
        mid_lse = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=dev)
    else:  # stage 1 writes `out` directly; the mid buffers are not touched
        mid_o = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=dev)
        mid_lse = torch.empty(1, 1, 1, dtype=torch.float32, device=dev)
    _decode_stage1[(B, Hkv, num_splits)](
        q, k_cache, v_cache, ks, vs, page_table, seq_lens, out, mid_o, mid_lse,
        float(sm_scale) * LOG2E, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        ks.stride(0), ks.stride(1), ks.stride(2),
        vs.stride(0), vs.stride(1), vs.stride(2),
        page_table.stride(0),
        out.stride(0), out.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, HEAD_DIM=D, PAGE_SIZE=S, DIRECT=num_splits == 1,
        BLOCK_H=next_pow2(group, 16), BLOCK_N=cfg.block_n,
        BLOCK_D=block_d, DOT_F32=dot_f32, QUANT=quant,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if num_splits > 1:
        _decode_stage2[(B, Hq)](
            mid_o, mid_lse, out, num_splits,
            mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
            mid_lse.stride(0), mid_lse.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=D, BLOCK_S=next_pow2(num_splits), BLOCK_D=block_d,
            num_warps=4,
        )
    return out


def decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """float64 reference of :func:`decode_attention`: [B, Hq, D] float64 (an 8-bit cache is
    dequantized exactly, in float64)."""
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    kd, vd = dequantize_ref(k_cache, k_scale), dequantize_ref(v_cache, v_scale)  # [P, S, Hkv, D]
    out = torch.empty(B, Hq, D, dtype=torch.float64, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        k, v = context_ref(kd, vd, page_table[b], n, Hq // Hkv)           # [n, Hq, D]
        scores = torch.einsum("hd,nhd->hn", q[b].double(), k) * sm_scale   # [Hq, n]
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
    return out
