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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentlang.runtime.cache.kv_quant import SCALE_DTYPE, KVFormat, dequantize, kv_dtype_name, kv_format, quantize


@dataclass(frozen=True)
class KVLayout:
    """Shape of the KV cache of one model: what one token costs in every layer.

    ``dtype`` is the compute (model) dtype; ``kv_dtype`` the storage format (``"auto"``: the
    model dtype; ``"int8"``, ``"fp8_e4m3"``, ``"fp8_e5m2"``: one byte per element plus a
    float16 scale per token and KV head)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    kv_dtype: str = "auto"

    def __post_init__(self) -> None:
        kv_format(self.kv_dtype)  # ValueError on an unknown or unavailable format

    @property
    def format(self) -> KVFormat | None:
        return kv_format(self.kv_dtype)

    @property
    def quantized(self) -> bool:
        return self.kv_dtype != "auto"

    @property
    def storage_dtype(self) -> torch.dtype:
        fmt = self.format
        return self.dtype if fmt is None else fmt.storage

    @property
    def kv_dtype_name(self) -> str:
        """Effective storage name (``"float32"``, ``"int8"``...): part of the cache namespace."""
        return kv_dtype_name(self.kv_dtype, self.dtype)

    def bytes_per_token(self) -> int:
        """Bytes one token takes in every layer, K and V, scales included."""
        elem = torch.empty((), dtype=self.storage_dtype).element_size()
        per_head = self.head_dim * elem
        if self.quantized:
            per_head += torch.empty((), dtype=SCALE_DTYPE).element_size()
        return self.num_layers * 2 * self.num_kv_heads * per_head


class KVPool:
    """Preallocated paged K/V storage for all layers."""

    def __init__(
        self,
        layout: KVLayout,
        page_size: int,
        num_pages: int | None = None,
        budget_mb: float | None = None,
        device: str | torch.device = "cpu",
    ):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_pages is None:
            if budget_mb is None:
                raise ValueError("KVPool needs num_pages or budget_mb")
            if budget_mb <= 0:
                raise ValueError(f"kv_budget_mb must be > 0, got {budget_mb}")
            num_pages = int(budget_mb * 2**20 // (layout.bytes_per_token() * page_size))
        if num_pages < 1:
            raise ValueError(
                f"KV budget too small: {budget_mb} MB holds no page of {page_size} tokens "
                f"({layout.bytes_per_token() * page_size} bytes per page)"
            )
        self.layout = layout
        self.page_size = page_size
        self.num_pages = num_pages
        self.device = torch.device(device)
        L, H, D = layout.num_layers, layout.num_kv_heads, layout.head_dim
        self.buffer = torch.zeros(
            L, 2, num_pages, page_size, H, D, dtype=layout.storage_dtype, device=self.device,
        )
        self.scales: torch.Tensor | None = None
        if layout.quantized:
            self.scales = torch.ones(
                L, 2, num_pages, page_size, H, dtype=SCALE_DTYPE, device=self.device,
            )
        # Index ops run on a byte view: CPU torch lacks index_copy_ for float8 tensors.
        self._raw = self.buffer.view(torch.uint8) if layout.quantized else self.buffer

    @property
    def num_layers(self) -> int:
        return self.layout.num_layers

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def nbytes(self) -> int:
        n = self.buffer.numel() * self.buffer.element_size()
        if self.scales is not None:
            n += self.scales.numel() * self.scales.element_size()
        return n

    def k_cache(self, layer: int) -> torch.Tensor:
        return self.buffer[layer, 0]  # [P, S, H, D]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.buffer[layer, 1]  # [P, S, H, D]

    def k_scale(self, layer: int) -> torch.Tensor | None:
        return None if self.scales is None else self.scales[layer, 0]  # [P, S, H]

    def v_scale(self, layer: int) -> torch.Tensor | None:
        return None if self.scales is None else self.scales[layer, 1]  # [P, S, H]

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k, v`` [T, Hkv, D] into ``slots`` [T] int64 (distinct, in
        ``[0, capacity_tokens)``), converted to the storage dtype (quantized when the pool is)."""
        H, D = self.layout.num_kv_heads, self.layout.head_dim
        if self.scales is None:                 # stored as computed: K and V in one copy
            kv = torch.stack((k, v)) if k.dtype == v.dtype else torch.stack((k, v.to(k.dtype)))
            if kv.dtype != self.layout.dtype:
                kv = kv.to(self.layout.dtype)                               # [2, T, H, D]
            self._raw[layer].view(2, -1, H, D).index_copy_(1, slots, kv)
            return
        fmt = self.layout.format
        for which, x in ((0, k), (1, v)):
            dst = self._raw[layer, which].view(-1, H, D)                  # [P*S, H, D]
            q, s = quantize(x, fmt)                                         # [T,H,D], [T,H]
            dst.index_copy_(0, slots, q.view(torch.uint8))
            self.scales[layer, which].view(-1, H).index_copy_(0, slots, s)

    def gather(self, layer: int, which: int, page_ids: torch.Tensor) -> torch.Tensor:
        """K (``which=0``) or V (``which=1``) of pages ``page_ids`` (integer tensor, any shape
        ``[...]``) as ``[..., page_size, Hkv, D]`` in the compute dtype, dequantized."""
        idx = page_ids.reshape(-1).long()
        shape = (*page_ids.shape, *self._raw.shape[3:])                     # [..., S, H, D]
        raw = self._raw[layer, which].index_select(0, idx).view(shape)
        if self.scales is None:
            return raw                                # auto: stored in the compute dtype
        scale = self.scales[layer, which].index_select(0, idx).view(shape[:-1])
        return dequantize(raw.view(self.layout.storage_dtype), scale, self.layout.dtype)

    def gather_kv(self, layer: int, page_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of pages ``page_ids`` (integer tensor ``[...]``), each ``[..., page_size,
        Hkv, D]`` in the compute dtype: :meth:`gather` of each (two copies along the pages:
        3x faster on CPU than one indexed copy of both); for a 1-D run of consecutive pages of
        an unquantized pool, views of the pool instead (no copy: read them, never write)."""
        idx = page_ids.reshape(-1)
        if (self.scales is None and page_ids.dim() == 1 and idx.numel() > 1
                and bool((idx[1:] - idx[:-1] == 1).all())):
            first = int(idx[0])
            k, v = self._raw[layer, :, first:first + idx.numel()].unbind(0)   # [n, S, H, D]
            return k, v
        return self.gather(layer, 0, page_ids), self.gather(layer, 1, page_ids)

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copy pages ``src[i] -> dst[i]`` in every layer, K and V and their scales
        (copy-on-write)."""
        if len(src) != len(dst):
            raise ValueError("copy_pages: src and dst differ in length")
        if not src:
            return
        s = torch.tensor(src, dtype=torch.long, device=self.device)
        d = torch.tensor(dst, dtype=torch.long, device=self.device)
        self._raw[:, :, d] = self._raw[:, :, s]
        if self.scales is not None:
            self.scales[:, :, d] = self.scales[:, :, s]
