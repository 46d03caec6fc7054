"""Paged KV pool: one preallocated tensor holding K and V of every layer in fixed-size pages.

Layout (contiguous, one allocation)::

    buffer: [num_layers, 2, num_pages, page_size, num_kv_heads, head_dim]   storage dtype
             layer      K/V
    scales: [num_layers, 2, num_pages, page_size, num_kv_heads]   float16, quantized pools only

``k_cache(layer)`` / ``v_cache(layer)`` are views ``[num_pages, page_size, kv_heads, head_dim]``
of the stored values (``k_scale(layer)`` / ``v_scale(layer)``: ``[num_pages, page_size,
kv_heads]``). A token's *slot* is ``page * page_size + offset``. Copying a page across every
layer (copy-on-write) is one indexed copy on dim 2 of ``buffer`` (and of ``scales``).

Readers and writers outside the kernels go through :meth:`KVPool.store` (quantizes when the
pool is quantized) and :meth:`KVPool.gather` (dequantizes to the compute dtype); see
:mod:`agentlang.runtime.cache.kv_quant` for the formats. The pool is sized once, from a page count or a memory
budget, never per request.

Sliding windows (``KVLayout.layer_windows``, Gemma 2 / 3): the sliding layers live in a second
buffer, ``window_buffer [L_sliding, 2, num_window_pages, page_size, H, D]``, with fewer pages;
page ids stay the global layers' everywhere (tables, tree, kernels' arguments), and the pool
maps them to window pages through ``windows.page_map`` for the sliding layers
(:mod:`agentlang.runtime.cache.window_pages` owns which blocks have one). ``k_cache(layer)``
of a sliding layer is a view of ``window_buffer``: index it with :meth:`window_pages` /
:meth:`window_slots` of the global ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentlang.runtime.cache.kv_quant import (FLOAT_STORAGE, SCALE_DTYPE, KVFormat, dequantize,
                                              kv_dtype_name, kv_format, quantize)
from agentlang.runtime.cache.window_pages import WindowPages, window_pool_pages
from agentlang.runtime.core.huge_pages import full_on_huge_pages


@dataclass(frozen=True)
class KVLayout:
    """Shape of the KV cache of one model: what one token costs in every layer.

    ``dtype`` is the compute (model) dtype; ``kv_dtype`` the storage format (``kv_quant.py``:
    the model dtype, bfloat16, or a byte an element plus a float16 scale a token and KV head)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    kv_dtype: str = "auto"
    layer_windows: tuple[int, ...] = ()    # each layer's sliding window, 0: global; (): none

    def __post_init__(self) -> None:
        kv_format(self.kv_dtype)  # ValueError on an unknown or unavailable format
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for "
                             f"{self.num_layers} layers")
        if len({w for w in self.layer_windows if w}) > 1:
            raise ValueError(f"layer_windows: one window size for every sliding layer, got "
                             f"{sorted(set(self.layer_windows) - {0})}")

    @property
    def window(self) -> int:
        """The sliding layers' window (0: no sliding layer)."""
        return max(self.layer_windows, default=0)

    @property
    def window_layers(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.layer_windows) if w)

    @property
    def global_layers(self) -> tuple[int, ...]:
        sliding = set(self.window_layers)
        return tuple(i for i in range(self.num_layers) if i not in sliding)

    @property
    def format(self) -> KVFormat | None:
        return kv_format(self.kv_dtype)

    @property
    def quantized(self) -> bool:
        """8 bits an element with scales (``format`` is not None)."""
        return self.format is not None

    @property
    def storage_dtype(self) -> torch.dtype:
        fmt = self.format
        if fmt is not None:
            return fmt.storage
        return FLOAT_STORAGE.get(self.kv_dtype, self.dtype)

    @property
    def kv_dtype_name(self) -> str:
        """Effective storage name (``"float32"``, ``"int8"``...): part of the cache namespace."""
        return kv_dtype_name(self.kv_dtype, self.dtype)

    def bytes_per_token(self, layers: int | None = None) -> int:
        """Bytes one token takes in every layer (or in ``layers`` of them), K and V, scales
        included: full-length KV."""
        elem = torch.empty((), dtype=self.storage_dtype).element_size()
        per_head = self.head_dim * elem
        if self.quantized:
            per_head += torch.empty((), dtype=SCALE_DTYPE).element_size()
        n = self.num_layers if layers is None else layers
        return n * 2 * self.num_kv_heads * per_head


class _Group:
    """The storage of one page group: ``buffer [L, 2, P, S, H, D]`` (+ scales, a byte view)."""

    def __init__(self, layout: KVLayout, layers: int, num_pages: int, page_size: int,
                 device: torch.device):
        H, D = layout.num_kv_heads, layout.head_dim
        self.buffer = full_on_huge_pages((layers, 2, num_pages, page_size, H, D), 0,
                                         layout.storage_dtype, device)
        self.scales: torch.Tensor | None = None
        if layout.quantized:
            self.scales = full_on_huge_pages((layers, 2, num_pages, page_size, H), 1, SCALE_DTYPE,
                                             device)
        # Index ops run on a byte view: CPU torch lacks index_copy_ for float8 tensors.
        self.raw = self.buffer.view(torch.uint8) if layout.quantized else self.buffer

    def nbytes(self) -> int:
        n = self.buffer.numel() * self.buffer.element_size()
        return n + (0 if self.scales is None else self.scales.numel() * self.scales.element_size())


def split_budget(layout: KVLayout, page_size: int, budget_bytes: float, max_batch_tokens: int,
                 fraction: float | None) -> tuple[int, int]:
    """(global pages, window pages) of the most global pages a budget holds with their window
    pages (:func:`~agentlang.runtime.cache.window_pages.window_pool_pages`); (0, 0) if none."""
    g = layout.bytes_per_token(len(layout.global_layers)) * page_size     # bytes of a page
    w = layout.bytes_per_token(len(layout.window_layers)) * page_size

    def wp(pages: int) -> int:
        return window_pool_pages(pages, page_size, layout.window, max_batch_tokens, fraction)

    lo, hi = 0, int(budget_bytes // g)           # the cost grows with the pages: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if mid * g + wp(mid) * w <= budget_bytes else (lo, mid - 1)
    return (lo, wp(lo)) if lo else (0, 0)


class KVPool:
    """Preallocated paged K/V storage for all layers (module doc)."""

    def __init__(
        self,
        layout: KVLayout,
        page_size: int,
        num_pages: int | None = None,
        budget_mb: float | None = None,
        device: str | torch.device = "cpu",
        window_fraction: float | None = None,
        max_batch_tokens: int = 2048,
    ):
        """``window_fraction``, ``max_batch_tokens``: the sliding layers' pages of a windowed
        layout (:func:`~agentlang.runtime.cache.window_pages.window_pool_pages`)."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if window_fraction is not None and not 0 < window_fraction <= 1:
            raise ValueError(f"window_kv_fraction must be in (0, 1], got {window_fraction!r}")
        windowed = bool(layout.window_layers)
        window_pages = 0
        if num_pages is None:
            if budget_mb is None:
                raise ValueError("KVPool needs num_pages or budget_mb")
            if budget_mb <= 0:
                raise ValueError(f"kv_budget_mb must be > 0, got {budget_mb}")
            if windowed:
                num_pages, window_pages = split_budget(layout, page_size, budget_mb * 2**20,
                                                       max_batch_tokens, window_fraction)
            else:
                num_pages = int(budget_mb * 2**20 // (layout.bytes_per_token() * page_size))
        if num_pages < 1:
            raise ValueError(
                f"KV budget too small: {budget_mb} MB holds no page of {page_size} tokens "
                f"({layout.bytes_per_token() * page_size} bytes per page)"
            )
        if windowed and not window_pages:
            window_pages = window_pool_pages(num_pages, page_size, layout.window,
                                             max_batch_tokens, window_fraction)
        self.layout = layout
        self.page_size = page_size
        self.num_pages = num_pages
        self.device = torch.device(device)
        main = _Group(layout, len(layout.global_layers), num_pages, page_size, self.device)
        self.buffer, self.scales = main.buffer, main.scales   # the global layers'
        self._groups = [main]
        self._where = {layer: (0, i) for i, layer in enumerate(layout.global_layers)}
        self.windows: WindowPages | None = None
        self.window_buffer: torch.Tensor | None = None
        self._device_map: tuple[int, torch.Tensor | None] = (-1, None)   # (version, map)
        if windowed:
            win = _Group(layout, len(layout.window_layers), window_pages, page_size, self.device)
            self._groups.append(win)
            self._where |= {layer: (1, i) for i, layer in enumerate(layout.window_layers)}
            self.windows = WindowPages(num_pages, window_pages, page_size, layout.window)
            self.window_buffer = win.buffer

    @property
    def num_layers(self) -> int:
        return self.layout.num_layers

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def nbytes(self) -> int:
        return sum(g.nbytes() for g in self._groups)

    # ---- sliding layers: global page ids -> window pages -----------------------------
    def windowed(self, layer: int) -> bool:
        """Whether ``layer``'s K/V live in the window group (index it with window ids)."""
        return self._where[layer][0] == 1

    def window_pages(self, page_ids: torch.Tensor) -> torch.Tensor:
        """The window pages of global ``page_ids`` (any shape; -1 where a block has none)."""
        w = self.windows
        if page_ids.device.type == "cpu":
            return w.page_map[page_ids.long()]
        if self._device_map[0] != w.version:        # one copy per change, not per layer
            self._device_map = (w.version, w.page_map.to(page_ids.device))
        return self._device_map[1][page_ids.long()]

    def window_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """Global slots ``[T]`` as window-group slots (every block must have a window page)."""
        S = self.page_size
        return self.window_pages(slots // S) * S + slots % S

    def _layer(self, layer: int, ids: torch.Tensor, slots: bool = False):
        """(group, index in it, ids translated for it)."""
        g, i = self._where[layer]
        if g == 1:
            ids = self.window_slots(ids) if slots else self.window_pages(ids)
        return self._groups[g], i, ids

    # ---- access -----------------------------------------------------------------------
    def k_cache(self, layer: int) -> torch.Tensor:
        g, i = self._where[layer]
        return self._groups[g].buffer[i, 0]  # [P, S, H, D]

    def v_cache(self, layer: int) -> torch.Tensor:
        g, i = self._where[layer]
        return self._groups[g].buffer[i, 1]  # [P, S, H, D]

    def k_scale(self, layer: int) -> torch.Tensor | None:
        g, i = self._where[layer]
        sc = self._groups[g].scales
        return None if sc is None else sc[i, 0]  # [P, S, H]

    def v_scale(self, layer: int) -> torch.Tensor | None:
        g, i = self._where[layer]
        sc = self._groups[g].scales
        return None if sc is None else sc[i, 1]  # [P, S, H]

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k, v`` [T, Hkv, D] into ``slots`` [T] int64 (distinct, in
        ``[0, capacity_tokens)``), converted to the storage dtype (quantized when the pool is)."""
        H, D = self.layout.num_kv_heads, self.layout.head_dim
        grp, i, slots = self._layer(layer, slots, slots=True)
        if grp.scales is None:                  # stored as computed: K and V in one copy
            kv = torch.stack((k, v)) if k.dtype == v.dtype else torch.stack((k, v.to(k.dtype)))
            if kv.dtype != grp.raw.dtype:
                kv = kv.to(grp.raw.dtype)                                   # [2, T, H, D]
            grp.raw[i].view(2, -1, H, D).index_copy_(1, slots, kv)
            return
        fmt = self.layout.format
        for which, x in ((0, k), (1, v)):
            dst = grp.raw[i, which].view(-1, H, D)                         # [P*S, H, D]
            q, s = quantize(x, fmt)                                         # [T,H,D], [T,H]
            dst.index_copy_(0, slots, q.view(torch.uint8))
            grp.scales[i, which].view(-1, H).index_copy_(0, slots, s)

    def gather(self, layer: int, which: int, page_ids: torch.Tensor) -> torch.Tensor:
        """K (``which=0``) or V (``which=1``) of pages ``page_ids`` (integer tensor, any shape
        ``[...]``) as ``[..., page_size, Hkv, D]`` in the compute dtype, dequantized."""
        grp, i, ids = self._layer(layer, page_ids)
        return self._gather(grp, i, which, ids)

    def _gather(self, grp: _Group, i: int, which: int, page_ids: torch.Tensor) -> torch.Tensor:
        idx = page_ids.reshape(-1).long()
        shape = (*page_ids.shape, *grp.raw.shape[3:])                       # [..., S, H, D]
        raw = grp.raw[i, which].index_select(0, idx).view(shape)
        if grp.scales is None:
            return self._widened(raw)
        scale = grp.scales[i, which].index_select(0, idx).view(shape[:-1])
        return dequantize(raw.view(self.layout.storage_dtype), scale, self.layout.dtype)

    def _widened(self, t: torch.Tensor) -> torch.Tensor:
        """Unscaled storage ``t`` in the compute dtype (widened: a bf16 pool, float32 model)."""
        return t if t.dtype == self.layout.dtype else t.to(self.layout.dtype)

    def gather_kv(self, layer: int, page_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of pages ``page_ids`` (integer tensor ``[...]``), each ``[..., page_size,
        Hkv, D]`` in the compute dtype: :meth:`gather` of each (two copies along the pages:
        3x faster on CPU than one indexed copy of both); for a 1-D run of consecutive pages of
        an unquantized pool, views of the pool instead (no copy: read them, never write)."""
        grp, i, page_ids = self._layer(layer, page_ids)
        idx = page_ids.reshape(-1)
        if (grp.scales is None and page_ids.dim() == 1 and idx.numel() > 1
                and bool((idx[1:] - idx[:-1] == 1).all())):
            first = int(idx[0])
            k, v = grp.raw[i, :, first:first + idx.numel()].unbind(0)   # [n, S, H, D]
            return self._widened(k), self._widened(v)
        return self._gather(grp, i, 0, page_ids), self._gather(grp, i, 1, page_ids)

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copy pages ``src[i] -> dst[i]`` in every layer, K and V and their scales
        (copy-on-write); in the sliding layers too where ``src[i]`` has a window page (then
        ``dst[i]`` must have one)."""
        if len(src) != len(dst):
            raise ValueError("copy_pages: src and dst differ in length")
        if not src:
            return
        s = torch.tensor(src, dtype=torch.long, device=self.device)
        d = torch.tensor(dst, dtype=torch.long, device=self.device)
        pairs = [(self._groups[0], s, d)]
        if self.windows is not None:
            ws, wd = self.window_pages(s), self.window_pages(d)
            keep = ws >= 0
            if bool((wd[keep] < 0).any()):
                raise ValueError("copy_pages: a destination page has no window page")
            pairs.append((self._groups[1], ws[keep], wd[keep]))
        for grp, a, b in pairs:
            grp.raw[:, :, b] = grp.raw[:, :, a]
            if grp.scales is not None:
                grp.scales[:, :, b] = grp.scales[:, :, a]
