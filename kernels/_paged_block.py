"""The inner steps both paged attention kernels (decode and extend) share, for one block of
keys: read the block's K through the page table and score it (``paged_qk_block``), then fold the
block into a running flash-attention softmax with its V (``online_softmax_step``). 8-bit caches
are dequantized right after each load. The dots and the softmax step themselves (``qk_dot``,
``softmax_pv``) also serve K/V tiles read from elsewhere.

K, V and the query rows stay in their storage dtype until the dot: with ``DOT_F32`` they are
widened to fp32 right after the load (always so under the interpreter, whose bf16 arithmetic is
not faithful), otherwise they enter the tensor-core dot in the query's dtype."""

import triton
import triton.language as tl

LAZY_THRESHOLD = tl.constexpr(8.0)  # log2 units: probabilities stay below 256 between rescales


@triton.jit
def paged_qk_block(
    q, Q, K, KScale, PageTable, pt_row, n, mask_n, kvh, offs_d, mask_d,
    stride_kp, stride_ks, stride_kh, stride_ksp, stride_kss, stride_kvh_s,
    stride_vp, stride_vs, stride_vh,
    PAGE_SIZE: tl.constexpr, QUANT: tl.constexpr, DOT_F32: tl.constexpr,
):
    """Scores of query rows ``q [R, BLOCK_D]`` against keys at positions ``n [BLOCK_N]`` of the
    sequence whose page-table row starts at ``PageTable + pt_row``.
    Returns ``(qk [R, BLOCK_N] unscaled and unmasked, page ids [BLOCK_N], V offsets [BLOCK_N])``."""
    page = tl.load(PageTable + pt_row + n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
    k_off = page * stride_kp + (n % PAGE_SIZE) * stride_ks + kvh * stride_kh
    v_off = page * stride_vp + (n % PAGE_SIZE) * stride_vs + kvh * stride_vh
    kt = tl.load(
        K + k_off[None, :] + offs_d[:, None],
        mask=mask_n[None, :] & mask_d[:, None], other=0.0,
    )                                                                     # [BLOCK_D, BLOCK_N]
    if QUANT:
        slot_s = page * stride_ksp + (n % PAGE_SIZE) * stride_kss + kvh * stride_kvh_s
        kt = kt.to(tl.float32) * tl.load(KScale + slot_s, mask=mask_n, other=0.0).to(
            tl.float32)[None, :]
    return qk_dot(q, kt, Q, DOT_F32), page, v_off


@triton.jit
def qk_dot(q, kt, Q, DOT_F32: tl.constexpr):
    """Unscaled scores ``q [R, BLOCK_D] @ kt [BLOCK_D, BLOCK_N]`` in fp32."""
    if DOT_F32:
        return tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
    return tl.dot(q.to(Q.dtype.element_ty), kt.to(Q.dtype.element_ty))


@triton.jit
def online_softmax_step(
    qk, m_i, l_i, acc,             # qk [R, BLOCK_N] (log2-scaled, -inf where masked); m_i, l_i [R]
    Q, V, VScale, v_off, page, n, kvh, offs_d, mask_n, mask_d,
    stride_vsp, stride_vss, stride_vvh_s,
    PAGE_SIZE: tl.constexpr, QUANT: tl.constexpr, DOT_F32: tl.constexpr,
    LAZY: tl.constexpr = False,
):
    """Loads the block's V through the page table; returns the updated ``(m_i, l_i, acc)``;
    acc: [R, BLOCK_D] fp32."""
    v = tl.load(
        V + v_off[:, None] + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :], other=0.0,
    )                                                                     # [BLOCK_N, BLOCK_D]
    if QUANT:
        slot_s = page * stride_vsp + (n % PAGE_SIZE) * stride_vss + kvh * stride_vvh_s
        v = v.to(tl.float32) * tl.load(VScale + slot_s, mask=mask_n, other=0.0).to(
            tl.float32)[:, None]
    return softmax_pv(qk, m_i, l_i, acc, v, Q, DOT_F32, LAZY)


@triton.jit
def softmax_pv(qk, m_i, l_i, acc, v, Q, DOT_F32: tl.constexpr, LAZY: tl.constexpr = False):
    """One online-softmax step: fold scores ``qk [R, BLOCK_N]`` (log2-scaled, -inf where masked)
    and their values ``v [BLOCK_N, BLOCK_D]`` into ``(m_i, l_i [R], acc [R, BLOCK_D] fp32)``;
    returns the updated triple. The row max must be finite after the step.

    ``LAZY``: ``m_i`` is a reference point, not the exact running max. It moves (and ``acc``,
    ``l_i`` are rescaled: one multiply per accumulator element) only when some row's max grew
    past it by more than ``LAZY_THRESHOLD`` (log2 units); otherwise the probabilities stay below
    2**LAZY_THRESHOLD and the rescale is skipped for the whole block. Exact up to rounding:
    numerator and denominator share the reference point."""
    m_cand = tl.maximum(m_i, tl.max(qk, 1))
    if LAZY:
        if tl.max(m_cand - m_i, 0) > LAZY_THRESHOLD:  # +inf on the first block
            alpha = tl.exp2(m_i - m_cand)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_cand
        p = tl.exp2(qk - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        m_new = m_i
    else:
        m_new = m_cand
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]  # rescaled, then accumulated into by the dot itself
    if DOT_F32:
        acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(Q.dtype.element_ty), v.to(Q.dtype.element_ty), acc)
    return m_new, l_i, acc
