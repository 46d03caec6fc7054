"""Correctness checks of ``bench/kernels.py``: every kernel against its float64 reference at
real sizes, in every input dtype and 8-bit cache dtype, before anything is timed."""

from __future__ import annotations

import torch

from bench.kernel_util import extend_inputs, new_kv, paged_context, quantized, rel_err

TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
QUANT = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)


class CheckLog(list):
    """The list of check records; ``record`` appends one and prints it."""

    def record(self, name: str, err: float, tol: float) -> bool:
        ok = err <= tol
        self.append({"check": name, "rel_err": err, "tol": tol, "ok": ok})
        print(f"  {'ok  ' if ok else 'FAIL'} {name:52s} rel_err {err:.2e} (tol {tol:.0e})",
              flush=True)
        return ok


def decode_case(kernels, log: CheckLog, hq, hkv, d, page, dtype, check_len, gen, dev,
                cache_dtype=None, config=None, label="") -> bool:
    """16 sequences of random lengths in [1, check_len] (the first of length 1)."""
    lens = torch.randint(1, check_len + 1, (16,), generator=gen, device=dev).tolist()
    lens[0] = 1
    kc, vc, table, sl = paged_context(lens, hkv, d, dtype, dev, page, gen)
    kc, vc, scales = quantized(kc, vc, cache_dtype)
    q = torch.randn(16, hq, d, device=dev, generator=gen).to(dtype)
    return check_attention(log, f"decode {hq}/{hkv} d{d} page{page}", kernels.decode_attention,
                           kernels.decode_attention_ref, (q, kc, vc, table, sl, d**-0.5),
                           scales, config, cache_dtype, label)


def extend_case(kernels, log: CheckLog, hq, hkv, d, dtype, check_len, gen, dev,
                cache_dtype=None, config=None, label="", with_new_kv=False) -> bool:
    """Four sequences: no prefix, a long prefix + one token, an odd prefix, a half prefix;
    ``with_new_kv``: the new tokens' K/V also passed as contiguous tensors (the engine's call)."""
    prefix = [0, check_len // 4, 37, check_len // 2]
    ext = [check_len // 6, 1, check_len // 8 + 1, check_len // 16]
    args, scales = extend_inputs(prefix, ext, hq, hkv, d, dtype, dev, gen=gen,
                                 cache_dtype=cache_dtype)
    extra = new_kv(args) if with_new_kv else {}
    return check_attention(log, f"extend {hq}/{hkv} d{d} page16", kernels.extend_attention,
                           kernels.extend_attention_ref, args, scales, config, cache_dtype,
                           label + (" new-kv" if with_new_kv else ""), extra)


def new_kv_same_as_paged(kernels, log: CheckLog, hq, hkv, d, check_len, gen, dev) -> bool:
    """Extend reading the new tokens' K/V from contiguous tensors against the same (default)
    launch reading them through the page table: bitwise equal (same key blocks, same order)."""
    prefix, ext = [0, 37, check_len // 2], [check_len // 4, check_len // 8 + 1, 1]
    args, _ = extend_inputs(prefix, ext, hq, hkv, d, torch.bfloat16, dev, gen=gen)
    paged = kernels.extend_attention(*args)
    got = kernels.extend_attention(*args, **new_kv(args))
    return log.record(f"extend {hq}/{hkv} d{d} new-kv == paged (1 = not bitwise equal)",
                      float(not torch.equal(got, paged)), 0)


def check_attention(log: CheckLog, what: str, kernel, ref, args, scales, config, cache_dtype,
                    label, extra=None) -> bool:
    """Run ``kernel`` (with the keywords ``extra`` too) into a NaN-poisoned output and record
    its error against ``ref`` (the tolerance of the query dtype, doubled over an 8-bit cache)."""
    q = args[0]
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    kernel(*args, out=out, config=config, **scales, **(extra or {}))
    tol = TOL[q.dtype] if cache_dtype is None else TOL[q.dtype] * 2
    cache = "" if cache_dtype is None else f" cache {str(cache_dtype)[6:]}"
    return log.record(f"{what} {str(q.dtype)[6:]}{cache}{label}",
                      rel_err(out, ref(*args, **scales)), tol)


def run_checks(kernels, check_len: int, dev: str) -> CheckLog:
    gen = torch.Generator(device=dev).manual_seed(0)
    log = CheckLog()
    print("checks against the float64 references", flush=True)
    for (hq, hkv, d), page in (((32, 8, 128), 16), ((9, 3, 64), 1), ((9, 3, 64), 32)):
        for dtype in TOL:
            decode_case(kernels, log, hq, hkv, d, page, dtype, check_len, gen, dev)
    for hq, hkv, d in ((32, 8, 128), (9, 3, 64)):
        for dtype in TOL:
            extend_case(kernels, log, hq, hkv, d, dtype, check_len, gen, dev)
            extend_case(kernels, log, hq, hkv, d, dtype, check_len, gen, dev, with_new_kv=True)
        new_kv_same_as_paged(kernels, log, hq, hkv, d, check_len, gen, dev)
        tma = kernels.LaunchConfig(block_m=64, block_n=64, num_warps=4, num_stages=3, tma=True)
        extend_case(kernels, log, hq, hkv, d, torch.bfloat16, check_len, gen, dev, config=tma,
                    label=f" {tma.label()}", with_new_kv=True)
    # 8-bit caches: the kernel against the reference over the same quantized cache
    for cache_dtype in QUANT:
        decode_case(kernels, log, 32, 8, 128, 16, torch.bfloat16, check_len, gen, dev,
                    cache_dtype)
        extend_case(kernels, log, 32, 8, 128, torch.bfloat16, check_len, gen, dev, cache_dtype)

    for cache_dtype in (torch.bfloat16, *QUANT):
        kc = torch.randn(32, 16, 8, 128, device=dev, generator=gen).to(torch.bfloat16)
        vc = torch.randn(32, 16, 8, 128, device=dev, generator=gen).to(torch.bfloat16)
        kc, vc, scales = quantized(kc, vc, None if cache_dtype == torch.bfloat16 else cache_dtype)
        k = torch.randn(256, 8, 128, device=dev, generator=gen).to(torch.bfloat16)
        v = torch.randn(256, 8, 128, device=dev, generator=gen).to(torch.bfloat16)
        slots = torch.randperm(32 * 16, device=dev, generator=gen)[:256]
        inputs = [t.cpu() for t in (k, v, kc, vc, slots, *scales.values())]
        want = kernels.store_kv_ref(k, v, kc, vc, slots, **scales)
        kernels.store_kv(k, v, kc, vc, slots, **scales)
        got = (kc, vc, *scales.values())
        same = all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want))
        if not log.record(f"kv store {str(cache_dtype)[6:]} (1 = not bitwise equal)",
                          float(not same), 0):
            explain_store_mismatch(kernels, got, want, inputs, scales)

    buf = torch.randn(4, 2, 64, 16, 8, 128, device=dev, generator=gen).to(torch.bfloat16)
    src, dst = torch.arange(0, 20, device=dev), torch.arange(40, 60, device=dev)
    want = kernels.copy_pages_ref(buf, src, dst)
    kernels.copy_pages(buf, src, dst)
    log.record("page copy bf16 (1 = not bitwise equal)", float(not torch.equal(buf, want)), 0)
    return log


def explain_store_mismatch(kernels, got, want, inputs, scales) -> None:
    """Print where a KV store differs from its reference, and whether the reference computed on
    the CPU agrees with the kernel or with the reference on the device."""
    k, v, kc, vc, slots, *sc = inputs
    want_cpu = kernels.store_kv_ref(k, v, kc, vc, slots, **dict(zip(scales, sc)))
    for name, g, w, wc in zip(("k_cache", "v_cache", "k_scale", "v_scale"), got, want, want_cpu):
        g, w, wc = bits(g).cpu(), bits(w).cpu(), bits(wc)
        diff = (g != w).nonzero()
        print(f"    {name}: {len(diff)} of {g.numel()} elements differ from the device reference;"
              f" kernel vs CPU reference: {int((g != wc).sum())} differ; device vs CPU "
              f"reference: {int((w != wc).sum())} differ", flush=True)
        for idx in diff[:4].tolist():
            idx = tuple(idx)
            print(f"      at {idx}: kernel {int(g[idx])} device-ref {int(w[idx])} "
                  f"cpu-ref {int(wc[idx])}", flush=True)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of an 8-bit tensor (float8 has no ``torch.equal`` on every build)."""
    return t.view(torch.uint8) if t.element_size() == 1 else t
