"""Kernel wrappers refuse bad input with a ValueError saying what was expected, and never
launch: the NaN-poisoned output stays untouched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_cases import make_case

from agentlang.kernels import LaunchConfig, copy_pages, decode_attention, extend_attention, store_kv


def _decode_args(**over):
    c = make_case([20, 5], [1, 1], 16, 4, 2, 64)
    args = dict(q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, page_table=c.page_table,
                seq_lens=c.seq_lens, sm_scale=c.scale)
    args.update(over)
    return args


def _bad_decode_cases():
    c = make_case([20, 5], [1, 1], 16, 4, 2, 64)
    P, S = c.k_cache.shape[:2]
    far_page = c.page_table.clone()
    far_page[0, 1] = P                      # page id out of range, inside seq 0's 2 pages
    neg_page = c.page_table.clone()
    neg_page[1, 0] = -1
    return [
        ({"page_table": c.page_table.long()}, "page_table must have dtype"),
        ({"seq_lens": c.seq_lens.long()}, "seq_lens must have dtype"),
        ({"seq_lens": torch.tensor([20, 5, 3], dtype=torch.int32)}, "seq_lens must have shape"),
        ({"seq_lens": torch.tensor([20, c.page_table.shape[1] * S + 1], dtype=torch.int32)},
         r"seq_lens must lie in \[1, 48\]"),
        ({"seq_lens": torch.tensor([20, 0], dtype=torch.int32)}, r"seq_lens must lie in \[1,"),
        ({"page_table": far_page}, "page_table entries covering seq_lens must lie in"),
        ({"page_table": neg_page}, "page_table entries covering seq_lens must lie in"),
        ({"page_table": c.page_table.t().contiguous().t()}, "page_table must be contiguous"),
        ({"q": c.q[:, :3]}, "must be a multiple of the cache's KV heads"),
        ({"q": c.q.repeat(1, 1, 2)}, "head_dim 128 must match the cache's head_dim 64"),
        ({"q": c.q.transpose(1, 2).contiguous().transpose(1, 2)}, "unit stride in its last dim"),
        ({"q": c.q.to(torch.float64)}, "q must have dtype"),
        ({"q": c.q[0]}, "q must have 3 dims"),
        ({"v_cache": c.v_cache.to(torch.float16)}, "v_cache dtype"),
        ({"v_cache": c.v_cache[:-1]}, "v_cache must have shape"),
        ({"page_table": c.page_table[:1]}, "page_table must have 2 rows"),
        ({"sm_scale": float("nan")}, "sm_scale must be a finite float"),
        ({"config": (64, 4, 2)}, "config must be a kernels.LaunchConfig"),
        ({"config": LaunchConfig(block_n=48, num_warps=4, num_stages=2)},
         r"config.block_n must be a power of two in \[16, 256\], got 48"),
        ({"config": LaunchConfig(block_n=8, num_warps=4, num_stages=2)}, "config.block_n"),
        ({"config": LaunchConfig(block_n=64, num_warps=3, num_stages=2)},
         "config.num_warps must be one of 1, 2, 4, 8, 16, got 3"),
        ({"config": LaunchConfig(block_n=64, num_warps=4, num_stages=0)},
         r"config.num_stages must be in \[1, 8\], got 0"),
    ]


@pytest.mark.parametrize("over,msg", _bad_decode_cases())
def test_decode_rejects(over, msg):
    args = _decode_args(**over)
    out = torch.full(args["q"].shape, float("nan"))  # fits q, so the error is about `over`
    with pytest.raises(ValueError, match=msg):
        decode_attention(**args, out=out)
    assert out.isnan().all()


def _extend_base():
    """An extend case (prefix 16 + 4 new, 9 new) and its keyword arguments."""
    c = make_case([20, 9], [4, 9], 16, 4, 2, 64)
    return c, dict(q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, page_table=c.page_table,
                   q_start_loc=c.q_start_loc, prefix_lens=c.prefix_lens, seq_lens=c.seq_lens,
                   sm_scale=c.scale)


def _assert_extend_rejects(base: dict, bad: list) -> None:
    """Each ``(override, message)``: a ValueError matching message, the output left unwritten."""
    for over, msg in bad:
        out = torch.full_like(base["q"], float("nan"))
        with pytest.raises(ValueError, match=msg):
            extend_attention(**{**base, **over}, out=out)
        assert out.isnan().all()


def test_extend_rejects_inconsistent_metadata():
    _, base = _extend_base()
    bad = [
        ({"q_start_loc": torch.tensor([0, 4, 12], dtype=torch.int32)}, r"q_start_loc\[B\]"),
        ({"q_start_loc": torch.tensor([1, 4, 13], dtype=torch.int32)}, r"q_start_loc\[0\]"),
        ({"q_start_loc": torch.tensor([0, 4], dtype=torch.int32)}, "q_start_loc must have shape"),
        ({"prefix_lens": torch.tensor([15, 0], dtype=torch.int32)}, "seq_lens - prefix_lens"),
        ({"prefix_lens": torch.tensor([-1, 0], dtype=torch.int32)}, "prefix_lens must lie in"),
        ({"seq_lens": torch.tensor([20, 56], dtype=torch.int32),
          "prefix_lens": torch.tensor([16, 47], dtype=torch.int32)}, r"seq_lens must lie in \[0, 48\]"),
    ]
    _assert_extend_rejects(base, bad)


def test_store_kv_rejects_bad_slots_and_shapes():
    P, S, H, D = 4, 16, 2, 64
    kc, vc = torch.zeros(P, S, H, D), torch.zeros(P, S, H, D)
    k = torch.randn(3, H, D)
    for slots, msg in [
        (torch.tensor([0, 5, P * S]), r"slot_mapping must lie in \[0, 63\]"),
        (torch.tensor([0, -1, 2]), "slot_mapping must lie in"),
        (torch.tensor([3, 5, 3]), "distinct slots"),
        (torch.tensor([0, 1, 2], dtype=torch.int32), "slot_mapping must have dtype"),
        (torch.tensor([0, 1]), "slot_mapping must have shape"),
    ]:
        with pytest.raises(ValueError, match=msg):
            store_kv(k, k, kc, vc, slots)
    with pytest.raises(ValueError, match="heads x head_dim"):
        store_kv(torch.randn(3, 3, D), torch.randn(3, 3, D), kc, vc, torch.tensor([0, 1, 2]))
    assert not kc.any() and not vc.any()


def test_copy_pages_rejects_bad_pages():
    buf = torch.zeros(2, 2, 5, 4, 1, 16)
    for src, dst, msg in [
        ([0, 1], [2, 5], r"dst must lie in \[0, 4\]"),
        ([-1], [2], "src must lie in"),
        ([0, 1], [2, 2], "distinct pages"),
        ([0, 1], [1, 2], "both a copy source and a destination"),
    ]:
        with pytest.raises(ValueError, match=msg):
            copy_pages(buf, torch.tensor(src), torch.tensor(dst))
    with pytest.raises(ValueError, match="buffer must be contiguous"):
        copy_pages(buf[..., :8], torch.tensor([0]), torch.tensor([1]))


def test_cpu_launch_without_interpreter_is_a_clear_error():
    # Importing works anywhere triton is installed; the launch on CPU tensors is what fails.
    code = (
        "import torch\nimport agentlang.kernels as kernels\n"
        "q = torch.zeros(1, 2, 64); c = torch.zeros(2, 16, 2, 64)\n"
        "pt = torch.zeros(1, 1, dtype=torch.int32); sl = torch.ones(1, dtype=torch.int32)\n"
        "try:\n"
        "    kernels.decode_attention(q, c, c, pt, sl, 0.125)\n"
        "except ValueError as e:\n"
        "    print('ERR', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "ERR Triton kernels need CUDA tensors" in res.stdout
    assert "TRITON_INTERPRET=1" in res.stdout


def test_extend_refuses_a_grid_cuda_cannot_launch():
    B = 65536  # one token each: the grid's sequence dimension would exceed CUDA's 65535
    q = torch.randn(B, 2, 64)
    cache = torch.randn(4, 16, 1, 64)
    table = torch.zeros(B, 1, dtype=torch.int32)
    ones = torch.ones(B, dtype=torch.int32)
    starts = torch.arange(B + 1, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    with pytest.raises(ValueError, match="at most 65535 sequences and query blocks; got 65536"):
        extend_attention(q, cache, cache, table, starts, ones * 0, ones, 0.125, out=out)
    assert out.isnan().all()


def test_extend_rejects_bad_new_kv():
    c, base = _extend_base()
    kn = torch.randn(13, 2, 64)
    fused = torch.randn(13, 2, 65)  # rows of 65 floats: not 16-byte aligned
    tma = LaunchConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, tma=True)
    bad = [
        ({"k_new": kn}, "k_new and v_new go together"),
        ({"k_new": kn, "v_new": kn.double()}, "v_new must have dtype"),
        ({"k_new": kn, "v_new": kn[:12]}, r"v_new must have shape \(13, 2, 64\)"),
        ({"k_new": kn.half(), "v_new": kn.half()}, "k_new must have dtype"),
        ({"config": tma}, "config.tma loads the new tokens' K/V tiles: pass k_new and v_new"),
        ({"config": tma, "k_new": kn, "v_new": fused[..., :64]}, "16-byte aligned rows"),
        ({"config": LaunchConfig(block_n=16, num_warps=4, num_stages=2, tma=1)},
         "config.tma must be True or False, got 1"),
        ({"k_new": kn, "v_new": kn, "max_prefix_len": 0}, r"prefix_lens must lie in \[0, 0\]"),
        ({"max_prefix_len": -1}, "max_prefix_len must be an int >= 0 or None, got -1"),
    ]
    from agentlang.kernels._quant import quantize_ref
    kq, ks = quantize_ref(c.k_cache.nan_to_num(), torch.int8)
    bad.append(({"k_cache": kq, "v_cache": kq, "k_scale": ks, "v_scale": ks, "k_new": kn,
                 "v_new": kn}, "k_new/v_new need a float cache"))
    _assert_extend_rejects(base, bad)
    d80 = make_case([20], [4], 16, 4, 2, 80)
    k80 = torch.randn(4, 2, 80)
    with pytest.raises(ValueError, match="config.tma needs head_dim a power of two >= 16, got 80"):
        extend_attention(d80.q, d80.k_cache, d80.v_cache, d80.page_table, d80.q_start_loc,
                         d80.prefix_lens, d80.seq_lens, d80.scale, config=tma, k_new=k80,
                         v_new=k80)
