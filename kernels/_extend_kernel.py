"""The Triton program of paged extend attention (:mod:`agentlang.kernels.extend_attention` has
the contract, the launch and the float64 reference): one program per (query block, head,
sequence), a FlashAttention-style loop over key blocks of the cached prefix (through the page
table) and of the new tokens (from their contiguous K/V)."""

from __future__ import annotations

import triton
import triton.language as tl

from agentlang.kernels._paged_block import online_softmax_step, paged_qk_block, qk_dot, softmax_pv

# What every key block of a program needs, bundled (Triton tuples):
#   qrows = (q [BLOCK_M, BLOCK_D], q_pos [BLOCK_M], kvh, offs_n, offs_d, mask_d, qk_scale)
#   pool = (K, V, KScale, VScale, PageTable, pt_row): the paged cache and the sequence's row
#   pstr = the 12 strides of K, K's scales, V, V's scales ([P, S, Hkv] each)
#   new = (KNew, VNew, q_start, prefix): the new tokens' K/V, position p at row q_start+p-prefix
#   nstr = (stride_knt, stride_knh, stride_vnt, stride_vnh)


@triton.jit
def _scores(qk, n, mask_n, q_pos, qk_scale, CAUSAL: tl.constexpr):
    """Scale ``qk [BLOCK_M, BLOCK_N]`` to log2 units; with ``CAUSAL`` mask (``-inf``) keys past
    ``mask_n`` or above each row's position (else every key is visible)."""
    if CAUSAL:
        visible = mask_n[None, :] & (n[None, :] <= q_pos[:, None])            # [BLOCK_M, BLOCK_N]
        return tl.where(visible, qk * qk_scale, float("-inf"))
    return qk * qk_scale


@triton.jit
def _paged_block(
    m_i, l_i, acc, n0, hi, Q, qrows, pool, pstr,
    PAGE_SIZE: tl.constexpr, QUANT: tl.constexpr, DOT_F32: tl.constexpr,
    CAUSAL: tl.constexpr, LAZY: tl.constexpr,
):
    """Fold the keys at positions ``n0 + offs_n`` (those ``< hi``), read through the page table,
    into the running softmax of the query rows; returns the new ``(m_i, l_i, acc)``."""
    q, q_pos, kvh, offs_n, offs_d, mask_d, qk_scale = qrows
    K, V, KScale, VScale, PageTable, pt_row = pool
    n = n0 + offs_n
    mask_n = n < hi
    qk, page, v_off = paged_qk_block(
        q, Q, K, KScale, PageTable, pt_row, n, mask_n, kvh, offs_d, mask_d,
        pstr[0], pstr[1], pstr[2], pstr[3], pstr[4], pstr[5], pstr[6], pstr[7], pstr[8],
        PAGE_SIZE, QUANT, DOT_F32,
    )
    qk = _scores(qk, n, mask_n, q_pos, qk_scale, CAUSAL)
    return online_softmax_step(
        qk, m_i, l_i, acc, Q, V, VScale, v_off, page, n, kvh, offs_d, mask_n, mask_d,
        pstr[9], pstr[10], pstr[11], PAGE_SIZE, QUANT, DOT_F32, LAZY,
    )


@triton.jit
def _new_block(
    m_i, l_i, acc, n0, hi, Q, qrows, pool, pstr, new, nstr, KDesc, VDesc,
    PAGE_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, DOT_F32: tl.constexpr,
    CAUSAL: tl.constexpr, LAZY: tl.constexpr,
    MIXED: tl.constexpr,   # the block straddles the prefix end: keys below it come from the pool
    TMA: tl.constexpr,     # load the tiles through the tensor descriptors KDesc, VDesc
):
    """Like :func:`_paged_block`, the keys read from the new tokens' contiguous K/V."""
    q, q_pos, kvh, offs_n, offs_d, mask_d, qk_scale = qrows
    KNew, VNew, q_start, prefix = new
    n = n0 + offs_n                                                           # [BLOCK_N]
    mask_n = n < hi
    if TMA:  # rows past the tensor's end read as zeros; masked below like any other row
        kt = KDesc.load([q_start + n0 - prefix, kvh * BLOCK_D]).T             # [BLOCK_D, BLOCK_N]
        v = VDesc.load([q_start + n0 - prefix, kvh * BLOCK_D])                # [BLOCK_N, BLOCK_D]
    else:
        r = (q_start + n - prefix).to(tl.int64)
        k_ptr = KNew + r[None, :] * nstr[0] + kvh * nstr[1] + offs_d[:, None]
        v_ptr = VNew + r[:, None] * nstr[2] + kvh * nstr[3] + offs_d[None, :]
        if MIXED:
            K, V, KScale, VScale, PageTable, pt_row = pool
            cached = n < prefix
            page = tl.load(PageTable + pt_row + n // PAGE_SIZE, mask=cached & mask_n,
                           other=0).to(tl.int64)
            k_off = page * pstr[0] + (n % PAGE_SIZE) * pstr[1] + kvh * pstr[2]
            v_off = page * pstr[6] + (n % PAGE_SIZE) * pstr[7] + kvh * pstr[8]
            k_ptr = tl.where(cached[None, :], K + k_off[None, :] + offs_d[:, None], k_ptr)
            v_ptr = tl.where(cached[:, None], V + v_off[:, None] + offs_d[None, :], v_ptr)
        kt = tl.load(k_ptr, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        v = tl.load(v_ptr, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
    qk = _scores(qk_dot(q, kt, Q, DOT_F32), n, mask_n, q_pos, qk_scale, CAUSAL)
    return softmax_pv(qk, m_i, l_i, acc, v, Q, DOT_F32, LAZY)


@triton.jit
def _key_range(
    m_i, l_i, acc, lo, hi, Q, qrows, pool, pstr, new, nstr, KDesc, VDesc,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr, DOT_F32: tl.constexpr, LAZY: tl.constexpr,
    PAGED: tl.constexpr,   # through the page table (else from the new tokens' K/V)
    CAUSAL: tl.constexpr, TMA: tl.constexpr,
):
    """Fold the key blocks starting at ``lo, lo + BLOCK_N, ... < hi`` (keys ``< hi``)."""
    for n0 in range(lo, hi, BLOCK_N):
        if PAGED:
            m_i, l_i, acc = _paged_block(m_i, l_i, acc, n0, hi, Q, qrows, pool, pstr,
                                         PAGE_SIZE, QUANT, DOT_F32, CAUSAL, LAZY)
        else:
            m_i, l_i, acc = _new_block(m_i, l_i, acc, n0, hi, Q, qrows, pool, pstr, new, nstr,
                                       KDesc, VDesc, PAGE_SIZE, BLOCK_D, DOT_F32, CAUSAL, LAZY,
                                       False, TMA)
    return m_i, l_i, acc


@triton.jit
def _extend_kernel(
    Q, K, V, KScale, VScale, PageTable, QStartLoc, PrefixLens, SeqLens, Out,
    KNew, VNew, KDesc, VDesc,  # the new tokens' K/V [T, Hkv, D] (NEW_KV), as descriptors (TMA)
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    stride_qt, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_ksp, stride_kss, stride_kvh_s,  # k_scale [P, S, Hkv] (8-bit caches)
    stride_vsp, stride_vss, stride_vvh_s,
    stride_pt,
    stride_ot, stride_oh,
    stride_knt, stride_knh, stride_vnt, stride_vnh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr,
    QUANT: tl.constexpr,  # 8-bit cache: dequantize K/V with their per-token scales after load
    PACK_GQA: tl.constexpr,
    NEW_KV: tl.constexpr,  # keys at positions >= the prefix come from KNew, VNew, not the pool
    TMA: tl.constexpr,
    PREFIX: tl.constexpr,  # some sequence may have a cached prefix (else NEW_KV reads no page)
    LAZY: tl.constexpr,    # LaunchConfig.lazy_rescale (see softmax_pv)
):
    # grid (heads, sequences, query blocks), the last query blocks (the most keys under a causal
    # mask) first: the longest programs start early and the short ones fill the tail
    pid_h = tl.program_id(0)
    b = tl.program_id(1)
    mblk = tl.num_programs(2) - 1 - tl.program_id(2)

    q_start = tl.load(QStartLoc + b)
    ext_len = tl.load(QStartLoc + b + 1) - q_start
    prefix = tl.load(PrefixLens + b)
    seq_len = tl.load(SeqLens + b)
    # A program's rows: BLOCK_M new tokens of one query head, or with PACK_GQA the
    # BLOCK_M (token, head) pairs of one KV head's query group, token-major (row r = token
    # r // GROUP, head r % GROUP of the group), so each K/V tile is loaded once per group.
    if PACK_GQA:
        kvh = pid_h
        n_rows = ext_len * GROUP
    else:
        kvh = pid_h // GROUP
        n_rows = ext_len
    r0 = mblk * BLOCK_M
    if r0 < n_rows:
        offs_r = r0 + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        mask_m = offs_r < n_rows
        mask_d = offs_d < HEAD_DIM
        if PACK_GQA:
            tok = offs_r // GROUP                                             # [BLOCK_M]
            head = kvh * GROUP + offs_r % GROUP
            first_tok = r0 // GROUP
            last_tok = (r0 + BLOCK_M - 1) // GROUP
        else:
            tok = offs_r
            head = pid_h + tl.zeros([BLOCK_M], dtype=tl.int32)
            first_tok = r0
            last_tok = r0 + BLOCK_M - 1
        rows = (q_start + tok).to(tl.int64)
        q = tl.load(
            Q + rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :], other=0.0,
        )                                                                     # [BLOCK_M, BLOCK_D]
        q_pos = prefix + tok                                                  # [BLOCK_M]

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # Keys below the block's first query position are visible to every row: those blocks
        # skip the causal mask. Keys past the block's last query are masked for every row. The
        # first masked block holds a key visible to every row (its first key is at or below the
        # block's first position), so no row's running max stays -inf.
        hi = tl.minimum(seq_len, prefix + last_tok + 1)
        full_hi = (prefix + first_tok) // BLOCK_N * BLOCK_N
        qrows = (q, q_pos, kvh, offs_n, offs_d, mask_d, qk_scale)
        pool = (K, V, KScale, VScale, PageTable, b * stride_pt)
        pstr = (stride_kp, stride_ks, stride_kh, stride_ksp, stride_kss, stride_kvh_s,
                stride_vp, stride_vs, stride_vh, stride_vsp, stride_vss, stride_vvh_s)
        new = (KNew, VNew, q_start, prefix)
        nstr = (stride_knt, stride_knh, stride_vnt, stride_vnh)
        keys = (Q, qrows, pool, pstr, new, nstr, KDesc, VDesc)
        if NEW_KV:
            # the same key blocks in the same order as below, each read from where its keys
            # live: whole prefix blocks through the page table, the block straddling the
            # prefix end from both, the rest from KNew, VNew
            pb = 0
            if PREFIX:
                pa = prefix // BLOCK_N * BLOCK_N
                pb = (prefix + BLOCK_N - 1) // BLOCK_N * BLOCK_N
                m_i, l_i, acc = _key_range(m_i, l_i, acc, 0, pa, *keys, PAGE_SIZE, BLOCK_N,
                                           BLOCK_D, QUANT, DOT_F32, LAZY, True, False, False)
                if pa < prefix:
                    m_i, l_i, acc = _new_block(m_i, l_i, acc, pa, hi, *keys, PAGE_SIZE, BLOCK_D,
                                               DOT_F32, True, LAZY, True, False)
            m_i, l_i, acc = _key_range(m_i, l_i, acc, pb, full_hi, *keys, PAGE_SIZE, BLOCK_N,
                                       BLOCK_D, QUANT, DOT_F32, LAZY, False, False, TMA)
            m_i, l_i, acc = _key_range(m_i, l_i, acc, tl.maximum(full_hi, pb), hi, *keys,
                                       PAGE_SIZE, BLOCK_N, BLOCK_D, QUANT, DOT_F32, LAZY, False,
                                       True, TMA)
        else:
            m_i, l_i, acc = _key_range(m_i, l_i, acc, 0, full_hi, *keys, PAGE_SIZE, BLOCK_N,
                                       BLOCK_D, QUANT, DOT_F32, LAZY, True, False, False)
            m_i, l_i, acc = _key_range(m_i, l_i, acc, full_hi, hi, *keys, PAGE_SIZE, BLOCK_N,
                                       BLOCK_D, QUANT, DOT_F32, LAZY, True, True, False)

        o = acc / l_i[:, None]
        tl.store(
            Out + rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            o.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :],
        )


