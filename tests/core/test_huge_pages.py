"""Large CPU tensors asked onto transparent huge pages (runtime/core/huge_pages.py), and the KV
pool that uses them."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.core.huge_pages import HUGE_PAGE, empty_on_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def vm_flags_at(t: torch.Tensor) -> set[str]:
    """The VmFlags of the mapping that holds t's first byte (/proc/self/smaps): ``hg`` where
    madvise(MADV_HUGEPAGE) was asked for it. Whether Linux then finds free 2 MB pages depends
    on the machine's memory (fragmentation), so that is what the tests can hold."""
    addr, inside = t.data_ptr(), False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    return set()


@pytest.mark.parametrize("shape, dtype", [((3, 1024, 1024), torch.bfloat16),
                                          ((5, 7), torch.float32), ((1,), torch.int64)])
def test_shape_dtype_and_values_as_torch_empty(shape, dtype):
    t = empty_on_huge_pages(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    t.fill_(3)
    assert bool((t == 3).all())
    if t.numel() * t.element_size() >= HUGE_PAGE:
        assert t.data_ptr() % HUGE_PAGE == 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not THP.exists()
                    or "[never]" in THP.read_text(), reason="no transparent huge pages here")
def test_a_large_tensor_is_asked_onto_huge_pages():
    t = empty_on_huge_pages((64 << 20,), torch.uint8).fill_(1)
    assert "hg" in vm_flags_at(t), "madvise(MADV_HUGEPAGE) was not applied to the tensor"
    # the control: a fresh anonymous mapping, never advised (a plain torch.empty can reuse
    # heap memory that an earlier pool of this process advised, and so carry the flag)
    fresh = mmap.mmap(-1, 64 << 20)
    plain = torch.frombuffer(fresh, dtype=torch.uint8).fill_(1)
    assert "hg" not in vm_flags_at(plain)
    del plain


def test_kv_pool_buffers_start_zeroed_and_quantized_scales_at_one():
    layout = KVLayout(num_layers=2, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16)
    pool = KVPool(layout, page_size=16, num_pages=2000)
    assert pool.buffer.shape == (2, 2, 2000, 16, 3, 64) and bool((pool.buffer == 0).all())
    q = KVPool(KVLayout(num_layers=2, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16,
                        kv_dtype="int8"), page_size=16, num_pages=2000)
    assert bool((q.buffer == 0).all()) and bool((q.scales == 1).all())
