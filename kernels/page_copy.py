"""Page copy: copy pages ``src[i] -> dst[i]`` in every layer, K and V, in one launch
(copy-on-write of shared pages).

Works on the whole pool buffer [L, 2, P, S, Hkv, D] (and, for an 8-bit pool, its scales
[L, 2, P, S, Hkv]); one program copies one chunk of one page of one (layer, K|V) plane. The copy
is bitwise (no dtype conversion).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentlang.kernels._common import (
    CACHE_DTYPES,
    check_launchable,
    check_ranges,
    check_shape,
    check_tensor,
    next_pow2,
)
from agentlang.kernels._quant import SCALE_DTYPE, quant_spec


@triton.jit
def _copy_pages_kernel(
    Buf, Src, Dst,
    stride_plane, stride_page,
    PAGE_NUMEL: tl.constexpr, BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    plane = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2)
    src = tl.load(Src + i).to(tl.int64)
    dst = tl.load(Dst + i).to(tl.int64)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < PAGE_NUMEL
    base = Buf + plane * stride_plane
    x = tl.load(base + src * stride_page + offs, mask=mask)
    tl.store(base + dst * stride_page + offs, x, mask=mask)


def copy_pages(
    buffer: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    *,
    scales: torch.Tensor | None = None,
    check_indices: bool = True,
) -> None:
    """Copy pages ``src[i] -> dst[i]`` (int64 or int32 [N]) of ``buffer`` [L, 2, P, S, Hkv, D]
    (contiguous, in place) in every layer and for K and V, and of ``scales`` [L, 2, P, S, Hkv]
    (contiguous; required iff the buffer is 8-bit). Page ids must lie in ``[0, P)``, the
    ``dst`` pages must be distinct and no page may be both a source and a destination;
    ``check_indices=False`` skips checking that (one sync)."""
    check_tensor("buffer", buffer, 6, CACHE_DTYPES, None, contiguous=True)
    dev = buffer.device
    if quant_spec(buffer.dtype) is not None:
        if scales is None:
            raise ValueError(f"scales is required: buffer is quantized ({buffer.dtype})")
        check_tensor("scales", scales, 5, (SCALE_DTYPE,), dev, contiguous=True)
        check_shape("scales", scales, tuple(buffer.shape[:5]))
    elif scales is not None:
        raise ValueError(f"scales is only for an 8-bit buffer, which is {buffer.dtype}")
    check_tensor("src", src, 1, (torch.int32, torch.int64), dev, contiguous=True)
    check_tensor("dst", dst, 1, (torch.int32, torch.int64), dev, contiguous=True)
    check_shape("dst", dst, tuple(src.shape))
    check_launchable(_copy_pages_kernel, dev)
    N = src.shape[0]
    if N == 0:
        return
    L, _, P = buffer.shape[:3]
    if check_indices:
        check_ranges([("src", src, 0, P - 1), ("dst", dst, 0, P - 1)])
        if torch.unique(dst).numel() != N:
            raise ValueError("dst must hold distinct pages")
        if torch.isin(src, dst).any():
            raise ValueError("a page may not be both a copy source and a destination")
    # bytes are copied as bytes (the interpreter has no float8 arithmetic to round-trip)
    planes = [buffer.view(torch.uint8) if buffer.element_size() == 1 else buffer]
    if scales is not None:
        planes.append(scales)
    for t in planes:
        page_numel = t[0, 0, 0].numel()
        block = min(next_pow2(page_numel), 4096)
        grid = (N, L * 2, triton.cdiv(page_numel, block))
        _copy_pages_kernel[grid](
            t, src, dst,
            t.stride(1), t.stride(2),
            PAGE_NUMEL=page_numel, BLOCK=block,
            num_warps=4,
        )


def copy_pages_ref(
    buffer: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, scales: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`copy_pages`, out of place: the buffer after the copy, or with
    ``scales`` the pair ``(buffer, scales)`` after the copy."""
    out = []
    for t in (buffer, scales) if scales is not None else (buffer,):
        raw = t.view(torch.uint8) if t.element_size() == 1 else t
        c = raw.clone()
        c[:, :, dst.long()] = raw[:, :, src.long()]
        out.append(c.view(t.dtype))
    return tuple(out) if scales is not None else out[0]
