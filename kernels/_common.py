"""Shared checks for the kernel wrappers: what a launch needs before it touches memory.

Every wrapper validates its arguments on the host (shapes, dtypes, devices, strides) and, when
asked, the index ranges held in its metadata tensors (one device sync), and raises ``ValueError``
naming the argument and what was expected. A kernel is only launched on tensors it cannot read
out of bounds.

The kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter, which is chosen
when a ``@triton.jit`` function is *defined*: ``TRITON_INTERPRET=1`` must be in the environment
before :mod:`kernels` is first imported.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from triton.runtime.interpreter import InterpretedFunction

from agentlang.kernels._quant import QUANT_DTYPES, check_scale

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CACHE_DTYPES = FLOAT_DTYPES + QUANT_DTYPES   # KV cache storage: float, or 8-bit with scales
PRECISIONS = ("auto", "fp32", "native")


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` was defined under ``TRITON_INTERPRET=1`` (runs on CPU tensors)."""
    return isinstance(kernel, InterpretedFunction)


def check_launchable(kernel, device: torch.device) -> None:
    """Refuse a launch the current setup cannot run, with a message that says why."""
    if is_interpreted(kernel):
        if device.type != "cpu":
            raise ValueError(
                f"kernels were imported under TRITON_INTERPRET=1 and run on CPU tensors; got {device}"
            )
        return
    if device.type != "cuda":
        raise ValueError(
            f"Triton kernels need CUDA tensors, got tensors on {device}. To run them on CPU, set "
            "TRITON_INTERPRET=1 in the environment before `kernels` is first imported."
        )
    if not torch.cuda.is_available():
        raise RuntimeError("Triton kernels need a CUDA device, and torch sees none")


def check_tensor(
    name: str,
    t: object,
    ndim: int,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device | None,
    contiguous: bool = False,
) -> torch.Tensor:
    """Check rank, dtype and device of ``t`` (any device when ``device`` is None); its last dim
    must be unit-stride (all of it contiguous when ``contiguous``)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} (like the first argument), got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dim, got strides {t.stride()}")
    return t


class CacheGeometry(NamedTuple):
    """What the attention wrappers read off a validated paged KV cache."""

    num_pages: int
    page_size: int
    kv_heads: int
    group: int  # query heads per KV head


def check_attention_inputs(q, k_cache, v_cache, k_scale, v_scale) -> CacheGeometry:
    """Checks both attention wrappers make: ``q [..., Hq, D]`` (3 dims) float; ``k_cache,
    v_cache [P, S, Hkv, D]`` of one shape and dtype on q's device, with ``k_scale, v_scale``
    exactly when the cache is 8-bit; ``Hq`` a multiple of ``Hkv``."""
    check_tensor("q", q, 3, FLOAT_DTYPES, None)
    D = q.shape[2]
    P, S, Hkv, Dk = check_kv_cache(k_cache, v_cache, k_scale, v_scale, q.device)
    if Dk != D:
        raise ValueError(f"q head_dim {D} must match the cache's head_dim {Dk}")
    return CacheGeometry(P, S, Hkv, check_head_dims(q.shape[1], Hkv, D))


def check_kv_cache(k_cache, v_cache, k_scale, v_scale, device) -> torch.Size:
    """``k_cache, v_cache [P, S, Hkv, D]`` of one shape and dtype on ``device``, with their
    scales exactly when 8-bit; returns the shape."""
    check_tensor("k_cache", k_cache, 4, CACHE_DTYPES, device)
    check_tensor("v_cache", v_cache, 4, CACHE_DTYPES, device)
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache dtype {v_cache.dtype} must match k_cache dtype {k_cache.dtype}")
    check_scale("k_scale", k_scale, k_cache, "k_cache")
    check_scale("v_scale", v_scale, v_cache, "v_cache")
    return k_cache.shape


def checked_out(out: torch.Tensor | None, q: torch.Tensor, sm_scale: object) -> torch.Tensor:
    """The output buffer (allocated like ``q`` when None, else checked to match it) after
    checking that ``sm_scale`` is a finite number."""
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    check_tensor("out", out, 3, FLOAT_DTYPES, q.device)
    check_shape("out", out, tuple(q.shape))
    if not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be a finite float, got {sm_scale!r}")
    return out


def context_ref(kd: torch.Tensor, vd: torch.Tensor, table_row: torch.Tensor, n: int,
                group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The references' gather: K and V ``[n, Hq, D]`` of the sequence whose pages are
    ``table_row`` in the caches ``kd, vd [P, S, Hkv, D]``, KV heads repeated ``group`` times."""
    pages = table_row[: -(-n // kd.shape[1])].long()
    k = kd[pages].flatten(0, 1)[:n].repeat_interleave(group, dim=1)
    v = vd[pages].flatten(0, 1)[:n].repeat_interleave(group, dim=1)
    return k, v


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(t.shape)}")


def check_head_dims(q_heads: int, kv_heads: int, head_dim: int) -> int:
    """Validate the head layout; returns the GQA group size (query heads per KV head)."""
    if kv_heads < 1 or q_heads % kv_heads != 0:
        raise ValueError(
            f"query heads ({q_heads}) must be a multiple of the cache's KV heads ({kv_heads})"
        )
    if not 1 <= head_dim <= 256:
        raise ValueError(f"head_dim must be in [1, 256], got {head_dim}")
    return q_heads // kv_heads


def next_pow2(n: int, minimum: int = 1) -> int:
    p = minimum
    while p < n:
        p *= 2
    return p


def use_fp32_dot(precision: str, kernel, *dtypes: torch.dtype) -> bool:
    """Whether the attention dots run on fp32 operands (``input_precision="ieee"``).

    ``auto``: fp32 under the interpreter (its bf16 arithmetic is not faithful), for fp32 inputs
    and for mixed input dtypes; otherwise the dots take fp16/bf16 operands (tensor cores) and
    accumulate in fp32. ``native`` forces the latter for fp16/bf16, ``fp32`` the former.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    mixed = len(set(dtypes)) > 1 or torch.float32 in dtypes
    if precision == "fp32" or mixed:
        return True
    if precision == "native":
        return False
    return is_interpreted(kernel)


class LaunchConfig(NamedTuple):
    """Tile sizes and launch shape of an attention kernel.

    block_n: keys per inner-loop block; block_m: query rows per program (extend only; decode
    programs hold one KV head's query group); num_warps, num_stages: Triton launch options;
    pack_gqa (extend only): a program's rows are (token, query head) pairs of one KV head's
    group, so K/V tiles are loaded once per group; tma (extend only, with ``k_new, v_new``): the
    new tokens' K/V tiles load through TMA tensor descriptors instead of per-row pointers;
    lazy_rescale (extend only): the running softmax max moves, and the accumulator is rescaled,
    only when a row's max grew by more than 2**8 (exact up to rounding; saves one multiply per
    accumulator element on most key blocks).
    """

    block_n: int
    num_warps: int
    num_stages: int
    block_m: int = 16  # decode: unused
    pack_gqa: bool = False  # extend only: rows = (token, head) pairs of a KV head's group
    tma: bool = False       # extend only: the new tokens' K/V tiles through tensor descriptors
    lazy_rescale: bool = False  # extend only: rescale the accumulator only on a large max change

    def label(self) -> str:
        flags = "".join(f" {name}" for name, on in (("packed", self.pack_gqa), ("tma", self.tma),
                                                    ("lazy", self.lazy_rescale)) if on)
        return f"m{self.block_m} n{self.block_n} w{self.num_warps} s{self.num_stages}{flags}"


def check_launch_config(config: LaunchConfig) -> LaunchConfig:
    """Tiles must be powers of two >= 16 (``tl.dot``'s minimum), warps 1-16, stages 1-8."""
    if not isinstance(config, LaunchConfig):
        raise ValueError(f"config must be a kernels.LaunchConfig, got {type(config).__name__}")
    for name in ("block_n", "block_m"):
        v = getattr(config, name)
        if v < 16 or v > 256 or v & (v - 1):
            raise ValueError(f"config.{name} must be a power of two in [16, 256], got {v}")
    if config.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"config.num_warps must be one of 1, 2, 4, 8, 16, got {config.num_warps}")
    if not 1 <= config.num_stages <= 8:
        raise ValueError(f"config.num_stages must be in [1, 8], got {config.num_stages}")
    for name in ("pack_gqa", "tma", "lazy_rescale"):
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"config.{name} must be True or False, got {getattr(config, name)!r}")
    return config


def range_error(name: str, lo: int, hi: int, lo_ok: int, hi_ok: int) -> str | None:
    """Message when observed values ``[lo, hi]`` leave the allowed ``[lo_ok, hi_ok]``."""
    if lo < lo_ok or hi > hi_ok:
        return f"{name} must lie in [{lo_ok}, {hi_ok}], got values in [{lo}, {hi}]"
    return None


def check_ranges(checks: list[tuple[str, torch.Tensor, int, int]]) -> None:
    """Check ``lo_ok <= values <= hi_ok`` for every ``(name, values, lo_ok, hi_ok)``.

    All minima and maxima are gathered with a single device-to-host copy (one sync).
    """
    checks = [c for c in checks if c[1].numel() > 0]
    if not checks:
        return
    stats = torch.stack(
        [s for _, v, _, _ in checks for s in (v.min().long(), v.max().long())]
    ).tolist()
    for i, (name, _, lo_ok, hi_ok) in enumerate(checks):
        msg = range_error(name, stats[2 * i], stats[2 * i + 1], lo_ok, hi_ok)
        if msg is not None:
            raise ValueError(msg)


def page_table_checks(
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    num_pages: int,
    page_size: int,
    min_seq_len: int = 1,
) -> list[tuple[str, torch.Tensor, int, int]]:
    """Range checks making every page-table read in bounds: ``min_seq_len <= seq_lens <=
    max_pages * page_size`` and the entries covering each sequence are page ids in
    ``[0, num_pages)``."""
    max_pages = page_table.shape[1]
    n_used = (seq_lens.long() + page_size - 1) // page_size                   # [B]
    cols = torch.arange(max_pages, device=page_table.device)
    used = cols[None, :] < n_used[:, None]                                    # [B, max_pages]
    entries = torch.where(used, page_table.long(), 0)
    return [
        ("seq_lens", seq_lens, min_seq_len, max_pages * page_size),
        ("page_table entries covering seq_lens", entries, 0, num_pages - 1),
    ]
