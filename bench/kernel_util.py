"""Helpers of ``bench/kernels.py``: timing, error measure and a paged K/V cache to time on."""

from __future__ import annotations

import time

import torch

PAGE = 16


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64."""
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def bench_ms(fn, device: str) -> float:
    """Median time of ``fn`` in ms (``do_bench`` on a GPU, one wall-clock run on CPU)."""
    if device == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=60, return_mode="median"))


def copy_gbps(nbytes: int, device: str) -> float:
    """Device copy bandwidth in GB/s, read + write bytes of one ``nbytes`` copy: the ceiling
    of memory-bound work."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), device)
    return 2 * src.numel() / ms / 1e6


def matmul_tflops(n: int, dtype: torch.dtype, device: str) -> float:
    """Dense ``[n, n] @ [n, n]`` rate in TFLOP/s: the ceiling of compute-bound work."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    ms = bench_ms(lambda: a @ b, device)
    return 2 * n**3 / ms / 1e9


def paged_context(lens, hkv, d, dtype, dev, page=PAGE, gen=None):
    """K/V caches [P, page, hkv, d] holding sequences of ``lens`` tokens in shuffled pages, their
    page table [B, max_pages] int32 and seq_lens [B] int32."""
    n_pages = [-(-n // page) for n in lens]
    P = sum(n_pages) + 1
    perm = torch.randperm(P, device=dev, generator=gen).int()
    table = torch.zeros(len(lens), max(n_pages), dtype=torch.int32, device=dev)
    i = 0
    for b, k in enumerate(n_pages):
        table[b, :k] = perm[i: i + k]
        i += k
    kc = torch.randn(P, page, hkv, d, device=dev, generator=gen).to(dtype)
    vc = torch.randn(P, page, hkv, d, device=dev, generator=gen).to(dtype)
    return kc, vc, table, torch.tensor(lens, dtype=torch.int32, device=dev)


def extend_inputs(prefix, ext, hq, hkv, d, dtype, dev, page=PAGE, gen=None,
                  cache_dtype=None):
    """Arguments of ``extend_attention`` (positional, then scale keywords) for sequences with
    ``prefix[b]`` cached and ``ext[b]`` new tokens; an 8-bit ``cache_dtype`` quantizes K/V."""
    kc, vc, table, sl = paged_context([p + e for p, e in zip(prefix, ext)], hkv, d, dtype, dev,
                                      page, gen)
    starts = torch.tensor([0, *torch.tensor(ext).cumsum(0).tolist()], dtype=torch.int32,
                          device=dev)
    q = torch.randn(sum(ext), hq, d, device=dev, generator=gen).to(dtype)
    kc, vc, scales = quantized(kc, vc, cache_dtype)
    args = (q, kc, vc, table, starts, torch.tensor(prefix, dtype=torch.int32, device=dev), sl,
            d**-0.5)
    return args, scales


def new_kv(args) -> dict:
    """The keywords the engine adds to an ``extend_attention`` call with arguments ``args``:
    ``k_new, v_new``, the new tokens' K/V [T, Hkv, D] (gathered here from their pool slots), and
    ``max_prefix_len``, the longest cached prefix."""
    q, kc, vc, table, starts, prefix, seq_lens = args[:7]
    S = kc.shape[1]
    pos = torch.cat([torch.arange(p, n, device=q.device)
                     for p, n in zip(prefix.tolist(), seq_lens.tolist())])        # [T]
    seq = torch.repeat_interleave(torch.arange(len(prefix), device=q.device),
                                  seq_lens.long() - prefix.long())
    slots = table[seq, pos // S].long() * S + pos % S
    return {"k_new": kc.flatten(0, 1)[slots].contiguous(),
            "v_new": vc.flatten(0, 1)[slots].contiguous(),
            "max_prefix_len": int(prefix.max())}


def quantized(kc, vc, cache_dtype):
    """``(k, v, {k_scale, v_scale})``: the caches quantized to ``cache_dtype`` with their
    per-token scales, or unchanged with no scales when ``cache_dtype`` is None."""
    if cache_dtype is None:
        return kc, vc, {}
    from agentlang.kernels._quant import quantize_ref  # after bench/kernels.py chose the interpreter or not

    kq, ks = quantize_ref(kc, cache_dtype)
    vq, vs = quantize_ref(vc, cache_dtype)
    return kq, vq, {"k_scale": ks, "v_scale": vs}


def graph_ms(fn, device: str) -> float:
    """Median time of ``fn`` replayed in a CUDA graph (``do_bench_cudagraph``): the kernels'
    own time without the host's launch cost. NaN on CPU or when ``fn`` cannot be captured."""
    if device == "cpu":
        return float("nan")
    from triton.testing import do_bench_cudagraph

    try:
        return float(do_bench_cudagraph(fn, rep=40, return_mode="median"))
    except Exception as e:  # noqa: BLE001 - reported, and the plain timing still stands
        print(f"  (CUDA-graph timing failed: {type(e).__name__}: {e})", flush=True)
        return float("nan")
