"""Paged KV pool: one preallocated tensor holding K and V of every layer in fixed-size pages.

Layout (contiguous, one allocation)::

    buffer: [num_layers, 2, num_pages, page_size, num_kv_heads, head_dim]
             layer      K/V

``k_cache(layer)`` / ``v_cache(layer)`` are views ``[num_pages, page_size, kv_heads, head_dim]``.
A token's *slot* is ``page * page_size + offset``; ``k_cache(layer).view(-1, H, D)[slot]`` is its K.
Copying a page across every layer (copy-on-write) is one indexed copy on dim 2.

The pool is sized once, from a page count or a memory budget, never per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    """Shape of the KV cache of one model: what one token costs in every layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * elem


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
        self.buffer = torch.zeros(
            layout.num_layers, 2, num_pages, page_size, layout.num_kv_heads, layout.head_dim,
            dtype=layout.dtype, device=self.device,
        )

    @property
    def num_layers(self) -> int:
        return self.layout.num_layers

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def k_cache(self, layer: int) -> torch.Tensor:
        return self.buffer[layer, 0]  # [P, S, H, D]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.buffer[layer, 1]  # [P, S, H, D]

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copy pages ``src[i] -> dst[i]`` in every layer, K and V (copy-on-write)."""
        if len(src) != len(dst):
            raise ValueError("copy_pages: src and dst differ in length")
        if not src:
            return
        s = torch.tensor(src, dtype=torch.long, device=self.device)
        d = torch.tensor(dst, dtype=torch.long, device=self.device)
        self.buffer[:, :, d] = self.buffer[:, :, s]
