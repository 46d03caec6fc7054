"""Random paged-KV test cases for the kernel tests: shuffled page tables, caches whose unused
slots are NaN (a kernel that reads past a sequence's end produces NaN)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedCase:
    q: torch.Tensor            # [T, Hq, D]
    k_cache: torch.Tensor      # [P, S, Hkv, D]
    v_cache: torch.Tensor      # [P, S, Hkv, D]
    page_table: torch.Tensor   # [B, max_pages] int32, padding 0
    q_start_loc: torch.Tensor  # [B+1] int32
    prefix_lens: torch.Tensor  # [B] int32
    seq_lens: torch.Tensor     # [B] int32
    scale: float


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def make_case(
    seq_lens: list[int],
    extend_lens: list[int],
    page_size: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_pages: int = 3,
) -> PagedCase:
    g = torch.Generator().manual_seed(seed)
    B = len(seq_lens)
    n_pages = [-(-n // page_size) for n in seq_lens]
    P = sum(n_pages) + spare_pages
    perm = torch.randperm(P, generator=g).tolist()
    max_pages = max(n_pages) + 1  # one padding column at least
    table = torch.zeros(B, max_pages, dtype=torch.int32)
    shape = (P, page_size, kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    for b, n in enumerate(seq_lens):
        pages = perm[: n_pages[b]]
        perm = perm[n_pages[b]:]
        table[b, : n_pages[b]] = torch.tensor(pages, dtype=torch.int32)
        k = torch.randn(n, kv_heads, head_dim, generator=g).to(dtype)
        v = torch.randn(n, kv_heads, head_dim, generator=g).to(dtype)
        slots = torch.tensor([pages[i // page_size] * page_size + i % page_size for i in range(n)])
        k_cache.view(-1, kv_heads, head_dim)[slots] = k
        v_cache.view(-1, kv_heads, head_dim)[slots] = v
    T = sum(extend_lens)
    starts = [0]
    for e in extend_lens:
        starts.append(starts[-1] + e)
    return PagedCase(
        q=torch.randn(T, q_heads, head_dim, generator=g).to(dtype),
        k_cache=k_cache,
        v_cache=v_cache,
        page_table=table,
        q_start_loc=torch.tensor(starts, dtype=torch.int32),
        prefix_lens=torch.tensor([s - e for s, e in zip(seq_lens, extend_lens)], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        scale=head_dim**-0.5,
    )
