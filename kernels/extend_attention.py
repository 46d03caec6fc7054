"""Paged extend (prefill) attention: the new tokens of many sequences in one launch.

Sequence ``b`` has ``prefix_lens[b]`` tokens cached and appends the ``q_start_loc[b+1] -
q_start_loc[b]`` new tokens whose queries are rows ``q_start_loc[b]:q_start_loc[b+1]`` of ``q``;
their K/V are already stored in the pool. New token ``i`` (absolute position
``prefix_lens[b] + i``) attends to every context token at a position ``<=`` its own, read
through the page table — or, when the caller passes the new tokens' K/V (``k_new, v_new``, as
the engine does), those from their contiguous rows (through TMA with ``LaunchConfig(tma=True)``)
and only the cached prefix through the page table. Serves prefill, chunked prefill, prefix-cache
hits and mixed batches (a decode is an extend of one token).

One program per (query block, head, sequence) runs a FlashAttention-style loop over key blocks
with an online softmax: a block is ``BLOCK_M`` new tokens of one query head, or (``pack_gqa``)
``BLOCK_M`` (token, head) rows of one KV head's whole query group, which loads each K/V tile
once per group instead of once per query head. Key blocks entirely below a query block's first
position skip the causal mask; ``LaunchConfig(lazy_rescale=True)`` skips the accumulator
rescale while no row's max grew by more than 2**8 (:func:`agentlang.kernels._paged_block.softmax_pv`).
"""

from __future__ import annotations

import torch
import triton

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
    is_interpreted,
    next_pow2,
    page_table_checks,
    use_fp32_dot,
)
from agentlang.kernels._extend_kernel import _extend_kernel
from agentlang.kernels._quant import dequantize_ref, quant_spec

LOG2E = 1.4426950408889634


def check_new_kv(k_new, v_new, k_cache, T: int, Hkv: int, D: int) -> None:
    """``k_new, v_new`` are both None, or both [T, Hkv, D] in the float cache's dtype."""
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new go together: pass both or neither")
    if k_new is None:
        return
    if quant_spec(k_cache.dtype) is not None:
        raise ValueError(
            f"k_new/v_new need a float cache (got {k_cache.dtype}): an 8-bit cache's tokens are "
            "read back dequantized, and the unquantized new K/V would change the result")
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        check_tensor(name, t, 3, (k_cache.dtype,), k_cache.device)
        check_shape(name, t, (T, Hkv, D))


def tma_descriptors(k_new, v_new, block_n: int, block_d: int):
    """Host-side TMA descriptors of ``k_new, v_new`` [T, Hkv, D] viewed as [T, Hkv*D], with
    [block_n, block_d] tiles; a ValueError says which requirement a tensor misses."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if k_new is None:
        raise ValueError("config.tma loads the new tokens' K/V tiles: pass k_new and v_new")
    if k_new.is_cuda and torch.cuda.get_device_capability(k_new.device)[0] < 9:
        raise ValueError("config.tma needs a GPU with TMA (compute capability 9.0 or newer), got "
                         f"{torch.cuda.get_device_name(k_new.device)}")
    T, Hkv, D = k_new.shape
    if D != block_d:
        raise ValueError(f"config.tma needs head_dim a power of two >= 16, got {D}")
    descs = []
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        row_bytes = t.stride(0) * t.element_size()
        if t.stride(1) != D or row_bytes % 16 or t.data_ptr() % 16:
            raise ValueError(
                f"config.tma needs {name} with heads packed in each row (stride(1) == {D}) and "
                f"16-byte aligned rows; got strides {t.stride()}, data_ptr % 16 = "
                f"{t.data_ptr() % 16}")
        descs.append(TensorDescriptor(t, [T, Hkv * D], [t.stride(0), 1], [block_n, block_d]))
    return descs


def default_extend_config(head_dim: int, interpreted: bool = False) -> LaunchConfig:
    """The launch the wrapper uses unless given one: the fastest of ``bench/kernels.py``'s sweep
    on an H200 for head_dim 64 and 128 (docs/benchmarks.md; GQA packing gained nothing there);
    larger head dims are untimed; small tiles under the interpreter, whose cost grows with the
    tile."""
    if interpreted:
        return LaunchConfig(block_m=32, block_n=32, num_warps=4, num_stages=2)
    block_d = next_pow2(head_dim, 16)
    if block_d > 128:
        return LaunchConfig(block_m=64, block_n=32, num_warps=8, num_stages=2)
    if block_d <= 64:
        return LaunchConfig(block_m=64, block_n=64, num_warps=4, num_stages=4)
    return LaunchConfig(block_m=64, block_n=32, num_warps=4, num_stages=3)


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    q_start_loc: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    *,
    out: torch.Tensor | None = None,
    max_extend_len: int | None = None,
    check_indices: bool = True,
    precision: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    config: LaunchConfig | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    max_prefix_len: int | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens of every sequence over its paged context.

    q: [T, Hq, D] (new tokens of all sequences, concatenated); k_cache, v_cache: [P, S, Hkv, D]
    holding every context token, the new ones included; page_table: [B, max_pages] int32;
    q_start_loc: [B+1] int32 (0 = q_start_loc[0] <= ... <= q_start_loc[B] = T);
    prefix_lens, seq_lens: [B] int32 with seq_lens = prefix_lens + extend lengths
    <= max_pages*S. Returns ``out`` [T, Hq, D] (allocated in q's dtype when not given).
    ``max_extend_len`` (host int, >= every extend length) avoids a device sync;
    ``check_indices=False`` skips the metadata range checks (one sync). An 8-bit cache (int8,
    float8; see :mod:`agentlang.kernels._quant`) needs ``k_scale, v_scale`` [P, S, Hkv] float16; K/V are
    dequantized right after each load. ``config`` overrides the launch
    (:func:`default_extend_config`).

    ``k_new, v_new`` [T, Hkv, D] (optional, together; a float cache's dtype): the new tokens'
    K/V exactly as stored in the cache. Keys at positions ``>= prefix_lens[b]`` are then read
    from these contiguous rows instead of through the page table; the key blocks and their
    order are unchanged, so the result is the same. With ``config.tma`` those tiles load
    through TMA tensor descriptors (head_dim a power of two >= 16, heads packed in each row,
    16-byte aligned rows). ``max_prefix_len`` (host int, >= every prefix length; checked with
    the other ranges) of 0 with ``k_new`` compiles the launch without the page-table path: a
    plain prefill then reads only contiguous K/V.
    """
    P, S, Hkv, group = check_attention_inputs(q, k_cache, v_cache, k_scale, v_scale)
    dev = q.device
    T, Hq, D = q.shape
    check_tensor("page_table", page_table, 2, (torch.int32,), dev, contiguous=True)
    B = page_table.shape[0]
    check_tensor("q_start_loc", q_start_loc, 1, (torch.int32,), dev, contiguous=True)
    check_shape("q_start_loc", q_start_loc, (B + 1,))
    check_tensor("prefix_lens", prefix_lens, 1, (torch.int32,), dev, contiguous=True)
    check_shape("prefix_lens", prefix_lens, (B,))
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,), dev, contiguous=True)
    check_shape("seq_lens", seq_lens, (B,))
    out = checked_out(out, q, sm_scale)
    check_launchable(_extend_kernel, dev)
    check_new_kv(k_new, v_new, k_cache, T, Hkv, D)
    if max_prefix_len is not None and (not isinstance(max_prefix_len, int) or max_prefix_len < 0):
        raise ValueError(f"max_prefix_len must be an int >= 0 or None, got {max_prefix_len!r}")
    if B == 0 or T == 0:
        return out
    ext = q_start_loc[1:] - q_start_loc[:-1]                                  # [B]
    if check_indices:
        check_ranges(
            [
                ("q_start_loc[0]", q_start_loc[:1], 0, 0),
                ("q_start_loc[B]", q_start_loc[-1:], T, T),
                ("q_start_loc[b+1] - q_start_loc[b]", ext, 0, T),
                ("prefix_lens", prefix_lens, 0, page_table.shape[1] * S
                 if max_prefix_len is None else min(max_prefix_len, page_table.shape[1] * S)),
                ("seq_lens - prefix_lens - (q_start_loc[b+1] - q_start_loc[b])",
                 seq_lens - prefix_lens - ext, 0, 0),
            ]
            + page_table_checks(page_table, seq_lens, P, S, min_seq_len=0)
        )
    if max_extend_len is None:
        max_extend_len = int(ext.max())
    if max_extend_len <= 0:
        return out

    block_d = next_pow2(D, 16)
    cfg = check_launch_config(
        default_extend_config(D, is_interpreted(_extend_kernel)) if config is None else config)
    quant = quant_spec(k_cache.dtype) is not None
    ks = k_scale if quant else k_cache  # unused pointers when not quantized
    vs = v_scale if quant else v_cache
    new_kv = k_new is not None
    kn = k_new if new_kv else k_cache   # unused pointers without the new tokens' K/V
    vn = v_new if new_kv else v_cache
    kd = vd = None
    if cfg.tma:
        kd, vd = tma_descriptors(k_new, v_new, cfg.block_n, block_d)
    if cfg.pack_gqa:
        grid = (Hkv, B, triton.cdiv(max_extend_len * group, cfg.block_m))
    else:
        grid = (Hq, B, triton.cdiv(max_extend_len, cfg.block_m))
    if max(grid[1:]) > 65535:  # CUDA's limit on the grid's y and z dimensions
        raise ValueError(f"extend_attention launches at most 65535 sequences and query blocks; "
                         f"got {B} sequences and {grid[2]} blocks of {cfg.block_m} rows")
    _extend_kernel[grid](
        q, k_cache, v_cache, ks, vs, page_table, q_start_loc, prefix_lens, seq_lens, out,
        kn, vn, kd, vd,
        float(sm_scale) * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        ks.stride(0), ks.stride(1), ks.stride(2),
        vs.stride(0), vs.stride(1), vs.stride(2),
        page_table.stride(0),
        out.stride(0), out.stride(1),
        kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1),
        GROUP=group, HEAD_DIM=D, PAGE_SIZE=S,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d,
        # an 8-bit cache is dequantized to fp32 and enters the dots like a cache in q's dtype
        DOT_F32=use_fp32_dot(precision, _extend_kernel, q.dtype,
                             q.dtype if quant else k_cache.dtype),
        QUANT=quant, PACK_GQA=cfg.pack_gqa, NEW_KV=new_kv, TMA=cfg.tma,
        PREFIX=not new_kv or max_prefix_len is None or max_prefix_len > 0,
        LAZY=cfg.lazy_rescale,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def extend_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    q_start_loc: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """float64 reference of :func:`extend_attention`: [T, Hq, D] float64 (an 8-bit cache is
    dequantized exactly, in float64)."""
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    kd, vd = dequantize_ref(k_cache, k_scale), dequantize_ref(v_cache, v_scale)  # [P, S, Hkv, D]
    out = torch.empty(T, Hq, D, dtype=torch.float64, device=q.device)
    starts = q_start_loc.tolist()
    for b in range(page_table.shape[0]):
        s, e, p0, n = starts[b], starts[b + 1], int(prefix_lens[b]), int(seq_lens[b])
        if e == s:
            continue
        k, v = context_ref(kd, vd, page_table[b], n, Hq // Hkv)           # [n, Hq, D]
        scores = torch.einsum("thd,nhd->htn", q[s:e].double(), k) * sm_scale  # [Hq, e-s, n]
        q_pos = torch.arange(p0, p0 + e - s, device=q.device)
        visible = torch.arange(n, device=q.device)[None, :] <= q_pos[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[s:e] = torch.einsum("htn,nhd->thd", scores.softmax(-1), v)
    return out
