"""KV store: write the new tokens' K and V into their pool slots, all heads, one launch.

Token ``t`` goes to slot ``slot_mapping[t] = page * page_size + offset``, i.e.
``k_cache[page, offset] = k[t]`` (and the same for V), converted to the cache's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import (
    FLOAT_DTYPES,
    check_launchable,
    check_ranges,
    check_shape,
    check_tensor,
    next_pow2,
)


@triton.jit
def _store_kv_kernel(
    K, V, KCache, VCache, Slots,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcp, stride_kcs, stride_kch,
    stride_vcp, stride_vcs, stride_vch,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(Slots + t).to(tl.int64)
    page = slot // PAGE_SIZE
    off = slot % PAGE_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD_DIM)      # [BLOCK_H, BLOCK_D]

    k = tl.load(K + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    tl.store(
        KCache + page * stride_kcp + off * stride_kcs + offs_h[:, None] * stride_kch
        + offs_d[None, :],
        k.to(tl.float32).to(KCache.dtype.element_ty), mask=mask,
    )
    v = tl.load(V + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(
        VCache + page * stride_vcp + off * stride_vcs + offs_h[:, None] * stride_vch
        + offs_d[None, :],
        v.to(tl.float32).to(VCache.dtype.element_ty), mask=mask,
    )


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check_indices: bool = True,
) -> None:
    """Write ``k, v`` [T, Hkv, D] into slots ``slot_mapping`` [T] int64 of ``k_cache, v_cache``
    [P, S, Hkv, D] (in place). Slots must be distinct and in ``[0, P*S)``;
    ``check_indices=False`` skips checking that (one sync)."""
    check_tensor("k", k, 3, FLOAT_DTYPES, None)
    dev = k.device
    T, H, D = k.shape
    check_tensor("v", v, 3, FLOAT_DTYPES, dev)
    check_shape("v", v, (T, H, D))
    check_tensor("k_cache", k_cache, 4, FLOAT_DTYPES, dev)
    check_tensor("v_cache", v_cache, 4, FLOAT_DTYPES, dev)
    P, S, Hc, Dc = k_cache.shape
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
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
    _store_kv_kernel[(T,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_HEADS=H, HEAD_DIM=D, PAGE_SIZE=S,
        BLOCK_H=next_pow2(H), BLOCK_D=next_pow2(D),
        num_warps=4,
    )


def store_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`store_kv`, out of place: the caches after the store."""
    P, S, H, D = k_cache.shape
    kc, vc = k_cache.clone(), v_cache.clone()
    slots = slot_mapping.long()
    kc.view(P * S, H, D)[slots] = k.double().to(kc.dtype)
    vc.view(P * S, H, D)[slots] = v.double().to(vc.dtype)
    return kc, vc
