"""KV store: write the new tokens' K and V into their pool slots, all heads, one launch.

Token ``t`` goes to slot ``slot_mapping[t] = page * page_size + offset``, i.e.
``k_cache[page, offset] = k[t]`` (and the same for V), converted to the cache's dtype. An 8-bit
cache (int8 / fp8, see :mod:`agentlang.kernels._quant`) is quantized on store: each (token, head) row gets
its scale written to ``k_scale[page, offset, head]`` (``v_scale`` for V).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentlang.kernels._common import (
    FLOAT_DTYPES,
    check_kv_cache,
    check_launchable,
    check_ranges,
    check_shape,
    check_tensor,
    next_pow2,
)
from agentlang.kernels._quant import quant_spec, quantize_ref, quantize_rows


@triton.jit
def _store_kv_kernel(
    K, V, KCache, VCache, Slots, KScale, VScale,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcp, stride_kcs, stride_kch,
    stride_vcp, stride_vcs, stride_vch,
    stride_ksp, stride_kss, stride_vsp, stride_vss,  # scales [P, S, H]: unit stride in H
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr, QMAX: tl.constexpr, IS_FP8: tl.constexpr, M: tl.constexpr,
    B: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(Slots + t).to(tl.int64)
    page = slot // PAGE_SIZE
    off = slot % PAGE_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD_DIM)      # [BLOCK_H, BLOCK_D]

    k = tl.load(K + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask,
                other=0.0).to(tl.float32)                                  # [BLOCK_H, BLOCK_D]
    v = tl.load(V + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask,
                other=0.0).to(tl.float32)
    k_dst = KCache + page * stride_kcp + off * stride_kcs + offs_h[:, None] * stride_kch \
        + offs_d[None, :]
    v_dst = VCache + page * stride_vcp + off * stride_vcs + offs_h[:, None] * stride_vch \
        + offs_d[None, :]
    if QUANT:
        kq, ks = quantize_rows(k, QMAX, IS_FP8, M, B)
        vq, vs = quantize_rows(v, QMAX, IS_FP8, M, B)
        tl.store(k_dst, kq, mask=mask)
        tl.store(v_dst, vq, mask=mask)
        mask_h = offs_h < NUM_HEADS
        tl.store(KScale + page * stride_ksp + off * stride_kss + offs_h, ks.to(tl.float16),
                 mask=mask_h)
        tl.store(VScale + page * stride_vsp + off * stride_vss + offs_h, vs.to(tl.float16),
                 mask=mask_h)
    else:
        tl.store(k_dst, k.to(KCache.dtype.element_ty), mask=mask)
        tl.store(v_dst, v.to(VCache.dtype.element_ty), mask=mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    check_indices: bool = True,
) -> None:
    """Write ``k, v`` [T, Hkv, D] into slots ``slot_mapping`` [T] int64 of ``k_cache, v_cache``
    [P, S, Hkv, D] (in place). Slots must be distinct and in ``[0, P*S)``;
    ``check_indices=False`` skips checking that (one sync). An 8-bit cache (int8, float8) needs
    ``k_scale, v_scale`` [P, S, Hkv] float16, where each token's scales are written."""
    check_tensor("k", k, 3, FLOAT_DTYPES, None)
    dev = k.device
    T, H, D = k.shape
    check_tensor("v", v, 3, FLOAT_DTYPES, dev)
    check_shape("v", v, (T, H, D))
    P, S, Hc, Dc = check_kv_cache(k_cache, v_cache, k_scale, v_scale, dev)
    if (Hc, Dc) != (H, D):
        raise ValueError(f"k/v have [*, {H}, {D}] heads x head_dim, the cache [*, *, {Hc}, {Dc}]")
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,), dev, contiguous=True)
    check_shape("slot_mapping", slot_mapping, (T,))
    check_launchable(_store_kv_kernel, dev)
    if T == 0:
        return
    if check_indices:
        check_ranges([("slot_mapping", slot_mapping, 0, P * S - 1)])
        if T > 1 and torch.unique(slot_mapping).numel() != T:
            raise ValueError("slot_mapping must hold distinct slots")
    spec = quant_spec(k_cache.dtype)
    kc, vc = k_cache, v_cache
    if spec is not None and spec.is_fp8:  # fp8 bits are computed in the kernel, stored as bytes
        kc, vc = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    ks = k_scale if k_scale is not None else k_cache  # unused pointers when not quantized
    vs = v_scale if v_scale is not None else v_cache
    _store_kv_kernel[(T,)](
        k, v, kc, vc, slot_mapping, ks, vs,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1),
        NUM_HEADS=H, HEAD_DIM=D, PAGE_SIZE=S,
        BLOCK_H=next_pow2(H), BLOCK_D=next_pow2(D),
        QUANT=spec is not None, QMAX=spec.qmax if spec else 0.0,
        IS_FP8=bool(spec and spec.is_fp8), M=spec.mant_bits if spec else 0,
        B=spec.exp_bias if spec else 0,
        num_warps=4,
    )


def store_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Reference of :func:`store_kv`, out of place: the caches after the store,
    ``(k_cache, v_cache)``, or for an 8-bit cache ``(k_cache, v_cache, k_scale, v_scale)``."""
    P, S, H, D = k_cache.shape
    slots = slot_mapping.long()
    if quant_spec(k_cache.dtype) is None:
        kc, vc = k_cache.clone(), v_cache.clone()
        kc.view(P * S, H, D)[slots] = k.double().to(kc.dtype)
        vc.view(P * S, H, D)[slots] = v.double().to(vc.dtype)
        return kc, vc
    out = []
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        q, s = quantize_ref(x, cache.dtype)
        c, sc = cache.view(torch.uint8).clone(), scale.clone()
        c.view(P * S, H, D)[slots] = q.view(torch.uint8)
        sc.view(P * S, H)[slots] = s
        out.append((c.view(cache.dtype), sc))
    return out[0][0], out[1][0], out[0][1], out[1][1]
