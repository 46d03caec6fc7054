"""The inner step both paged attention kernels share: fold one block of keys into a running
(flash-attention style) softmax — load the block's V through its page slots (dequantizing when
the cache is 8-bit), rescale the accumulator and add ``p @ v``."""

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(
    qk, m_i, l_i, acc,             # qk [R, BLOCK_N] (log2-scaled, -inf where masked); m_i, l_i [R]
    Q, V, VScale, v_off, page, n, kvh, offs_d, mask_n, mask_d,
    stride_vsp, stride_vss, stride_vvh_s,
    PAGE_SIZE: tl.constexpr, QUANT: tl.constexpr, DOT_F32: tl.constexpr,
):
    """Returns the updated ``(m_i, l_i, acc)``; acc: [R, BLOCK_D] fp32."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        V + v_off[:, None] + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :], other=0.0,
    ).to(tl.float32)                                                      # [BLOCK_N, BLOCK_D]
    if QUANT:
        slot_s = page * stride_vsp + (n % PAGE_SIZE) * stride_vss + kvh * stride_vvh_s
        v = v * tl.load(VScale + slot_s, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    if DOT_F32:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(Q.dtype.element_ty), v.to(Q.dtype.element_ty))
    return m_new, l_i, acc * alpha[:, None] + pv
