"""Benchmark of the paged-attention kernels on a CUDA GPU.

1. Checks every kernel against its float64 reference at real sizes (bf16, fp16 and fp32; the
   8-bit caches int8 / fp8 too).
2. Measures the device's copy bandwidth (a large device-to-device copy: read + write bytes),
   the ceiling for the memory-bound kernels.
3. Sweeps launch configurations (tile sizes, warps, pipeline stages) of decode and extend on a
   few target-sized cells, checks each against the reference, and keeps the fastest per head
   configuration for the tables (the defaults of the wrappers are among the candidates).
4. Times (``triton.testing.do_bench``, median):
   - decode attention, batch 1-256 x context 512-32k, for SmolLM2-like heads (9 q / 3 kv,
     head_dim 64) and Llama-8B-like heads (32 / 8, head_dim 128), bf16, page_size 16, shuffled
     pages; achieved GB/s counts the bytes it must read (K/V of every context token, Q, the
     page-table entries) and write (out);
   - extend attention against ``torch.nn.functional.scaled_dot_product_attention`` on the same
     data laid out contiguously (K/V expanded to the query heads beforehand);
   - KV store and page copy GB/s.
Prints tables and writes JSON to ``$OUT/kernels.json`` (when ``OUT`` is set) or
``bench/results/kernels.json``, rewritten after every section, so a section that fails (its
traceback is printed and recorded under ``errors``) loses nothing measured before it.
Exits with code 1 if a check or a section fails, 2 without CUDA.

    python bench/kernels.py            # on a GPU, < 5 minutes
    python bench/kernels.py --smoke    # CPU, Triton interpreter, tiny sizes: exercises the
                                       # script itself (its numbers mean nothing), no JSON
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

# this script's own folder is sys.path[0] and holds a kernels.py (this file): import the kernels
# package and bench's helper modules from the repository root instead
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from bench.kernel_util import (PAGE, bench_ms, copy_gbps, extend_inputs, graph_ms,  # noqa: E402
                               new_kv, rel_err)

SECTIONS = ("checks", "ceiling", "sweep-decode", "sweep-extend", "sweep-splits", "decode",
            "extend", "kv")
HEADS = {"smollm2 (9q/3kv, d64)": (9, 3, 64), "llama8b (32q/8kv, d128)": (32, 8, 128)}


@dataclass(frozen=True)
class Sizes:
    device: str
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    max_decode_tokens: int  # batch x context cap
    check_len: int          # longest sequence in the checks
    extend_cases: tuple[tuple[int, int, int], ...]  # (batch, prefix, new)
    store_tokens: tuple[int, ...]
    copy_layers: int
    copy_pages: tuple[int, ...]
    copy_bytes: int
    sweep_decode: tuple[tuple[int, int], ...]        # (batch, context) cells of the sweep
    sweep_extend: tuple[tuple[int, int, int], ...]   # (batch, prefix, new) cells of the sweep
    sweep_limit: int | None                          # candidates per kind (None: all)
    split_contexts: tuple[int, ...]                  # contexts of the split-rule sweep


GPU = Sizes("cuda", (1, 8, 32, 64, 128, 256), (512, 2048, 4096, 8192, 16384, 32768),
            1 << 22,  # 16 GB of K/V per layer for Llama-8B heads
            4096, ((1, 0, 4096), (4, 0, 2048), (16, 0, 512), (4, 2048, 512)),
            (256, 4096, 32768), 32, (1, 16, 256), 1 << 31,
            ((32, 4096), (64, 8192), (128, 16384)),
            ((1, 0, 4096), (4, 2048, 512), (16, 0, 512)), None,
            (2048, 4096, 8192, 32768))
SMOKE = Sizes("cpu", (1, 2), (32, 80), 160, 40, ((2, 0, 16), (1, 16, 8)), (8,), 2, (1, 2),
              1 << 20, ((2, 64),), ((1, 0, 32),), 2, (80,))


def copy_bandwidth(z: Sizes) -> float:
    return copy_gbps(z.copy_bytes, z.device)  # GB/s, read + write


def bench_decode(kernels, z: Sizes, ceiling: float, sms: int, configs: dict,
                 split_rule: tuple[int, int] | None) -> list[dict]:
    dev, rows = z.device, []
    for name, (hq, hkv, d) in HEADS.items():
        cfg = configs.get(name) or kernels.default_decode_config(d)
        pages = z.max_decode_tokens // PAGE
        kc = torch.randn(pages, PAGE, hkv, d, device=dev, dtype=torch.bfloat16)
        vc = torch.randn(pages, PAGE, hkv, d, device=dev, dtype=torch.bfloat16)
        elt = kc.element_size()
        print(f"\ndecode attention, {name}, bf16, page {PAGE}, launch {cfg.label()}, split rule "
              f"{split_rule or 'default'}", flush=True)
        print("  GB/s timed with do_bench | in a CUDA graph (kernel only), % of copy bandwidth")
        print(f"  {'batch':>5s} " + " ".join(f"{c:>19d}" for c in z.contexts))
        for B in z.batches:
            cells = []
            for ctx in z.contexts:
                if B * ctx > z.max_decode_tokens:
                    cells.append(f"{'-':>19s}")
                    continue
                n = ctx // PAGE
                table = torch.randperm(pages, device=dev)[: B * n].view(B, n).int()
                sl = torch.full((B,), ctx, dtype=torch.int32, device=dev)
                q = torch.randn(B, hq, d, device=dev, dtype=torch.bfloat16)
                out = torch.empty_like(q)
                splits = kernels.choose_num_splits(ctx, B, hkv, sms, *(split_rule or ()))
                fn = lambda: kernels.decode_attention(  # noqa: E731
                    q, kc, vc, table, sl, d**-0.5, out=out, max_seq_len=ctx, check_indices=False,
                    config=cfg, num_splits=splits)
                ms, g_ms = bench_ms(fn, dev), graph_ms(fn, dev)
                nbytes = 2 * B * ctx * hkv * d * elt + 2 * B * hq * d * elt + B * n * 4
                gbs, g_gbs = nbytes / ms / 1e6, nbytes / g_ms / 1e6
                rows.append({"heads": name, "batch": B, "context": ctx, "ms": ms, "bytes": nbytes,
                             "GBps": gbs, "pct_of_copy": 100 * gbs / ceiling,
                             "ms_graph": g_ms, "GBps_graph": g_gbs,
                             "pct_of_copy_graph": 100 * g_gbs / ceiling,
                             "num_splits": splits,
                             "config": cfg._asdict()})
                cells.append(f"{gbs:5.0f} | {g_gbs:5.0f} ({100 * g_gbs / ceiling:3.0f}%)")
            print(f"  {B:5d} " + " ".join(cells), flush=True)
        del kc, vc
        if dev == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_extend(kernels, z: Sizes, configs: dict) -> list[dict]:
    import torch.nn.functional as F

    dev, rows = z.device, []
    print("\nextend attention vs SDPA on contiguous data, bf16, page 16; triton = the engine's "
          "call (new tokens' K/V contiguous, prefix paged), paged = every K/V through the page "
          "table (same tiles, no TMA); graph = CUDA-graph replay (kernel time)")
    print(f"  {'heads':24s} {'batch':>5s} {'prefix':>6s} {'new':>5s} {'triton ms':>9s} "
          f"{'sdpa ms':>8s} {'ratio':>6s} {'graph: triton':>13s} {'paged':>6s} {'sdpa':>6s} "
          f"{'ratio':>6s} {'TFLOP/s':>7s} {'rel_err':>8s}  launch")
    for name, (hq, hkv, d) in HEADS.items():
        cfg = configs.get(name) or kernels.default_extend_config(d)
        for B, prefix, new in z.extend_cases:
            ctx = prefix + new
            args, _ = extend_inputs([prefix] * B, [new] * B, hq, hkv, d, torch.bfloat16, dev)
            q, kc, vc, table = args[:4]
            out, extra = torch.empty_like(q), new_kv(args)
            fn = lambda: kernels.extend_attention(  # noqa: E731
                *args, out=out, max_extend_len=new, check_indices=False, config=cfg, **extra)
            paged = lambda: kernels.extend_attention(  # noqa: E731
                *args, out=out, max_extend_len=new, check_indices=False,
                config=cfg._replace(tma=False))
            t_ms, tg_ms, pg_ms = bench_ms(fn, dev), graph_ms(fn, dev), graph_ms(paged, dev)
            fn()
            # the same data, contiguous: [B, Hq, L, D], K/V expanded to the query heads
            pages = table[:, : -(-ctx // PAGE)].long()
            k = kc[pages].flatten(1, 2)[:, :ctx].transpose(1, 2).repeat_interleave(hq // hkv, 1)
            v = vc[pages].flatten(1, 2)[:, :ctx].transpose(1, 2).repeat_interleave(hq // hkv, 1)
            qc = q.view(B, new, hq, d).transpose(1, 2).contiguous()
            k, v = k.contiguous(), v.contiguous()
            if prefix == 0:
                sdpa = lambda: F.scaled_dot_product_attention(qc, k, v, is_causal=True)  # noqa: E731
            else:
                mask = (torch.arange(ctx, device=dev)[None, :]
                        <= prefix + torch.arange(new, device=dev)[:, None])
                sdpa = lambda: F.scaled_dot_product_attention(qc, k, v, attn_mask=mask)  # noqa: E731
            s_ms, sg_ms = bench_ms(sdpa, dev), graph_ms(sdpa, dev)
            err = rel_err(out.view(B, new, hq, d).transpose(1, 2), sdpa())
            pairs = B * (prefix * new + new * (new + 1) / 2)
            tflops = 4 * pairs * hq * d / min(t_ms, tg_ms) / 1e9
            rows.append({"heads": name, "batch": B, "prefix": prefix, "new": new,
                         "triton_ms": t_ms, "sdpa_ms": s_ms, "ratio": t_ms / s_ms,
                         "triton_graph_ms": tg_ms, "sdpa_graph_ms": sg_ms,
                         "ratio_graph": tg_ms / sg_ms, "paged_graph_ms": pg_ms,
                         "paged_ratio_graph": pg_ms / sg_ms,
                         "TFLOPs": tflops, "rel_err_vs_sdpa": err, "config": cfg._asdict()})
            print(f"  {name:24s} {B:5d} {prefix:6d} {new:5d} {t_ms:9.3f} {s_ms:8.3f} "
                  f"{t_ms / s_ms:6.2f} {tg_ms:13.3f} {pg_ms:6.3f} {sg_ms:6.3f} "
                  f"{tg_ms / sg_ms:6.2f} {tflops:7.1f} {err:8.1e}  {cfg.label()}", flush=True)
            del kc, vc, k, v, args, q, extra
    return rows


def bench_kv_ops(kernels, z: Sizes, ceiling: float) -> list[dict]:
    dev, rows = z.device, []
    print("\nKV store and page copy, llama8b heads (8 kv, d128), bf16  (GB/s; % of copy bw)")
    for T in z.store_tokens:
        P = 2 * T // PAGE
        kc = torch.zeros(P, PAGE, 8, 128, device=dev, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        k = torch.randn(T, 8, 128, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        slots = torch.randperm(P * PAGE, device=dev)[:T]
        ms = bench_ms(lambda: kernels.store_kv(k, v, kc, vc, slots, check_indices=False), dev)
        nbytes = 4 * k.numel() * k.element_size() + T * 8  # read k, v; write them; slots
        gbs = nbytes / ms / 1e6
        rows.append({"op": "kv_store", "tokens": T, "ms": ms, "bytes": nbytes, "GBps": gbs,
                     "pct_of_copy": 100 * gbs / ceiling})
        print(f"  kv store  {T:6d} tokens          {ms * 1e3:9.1f} us {gbs:8.0f} GB/s "
              f"({100 * gbs / ceiling:3.0f}%)")
    L, P = z.copy_layers, 4 * max(z.copy_pages)
    buf = torch.zeros(L, 2, P, PAGE, 8, 128, device=dev, dtype=torch.bfloat16)
    for n in z.copy_pages:
        perm = torch.randperm(P, device=dev)
        src, dst = perm[:n], perm[n: 2 * n]
        ms = bench_ms(lambda: kernels.copy_pages(buf, src, dst, check_indices=False), dev)
        nbytes = 2 * n * L * 2 * buf[0, 0, 0].numel() * buf.element_size()
        gbs = nbytes / ms / 1e6
        rows.append({"op": "page_copy", "pages": n, "layers": L, "ms": ms, "bytes": nbytes,
                     "GBps": gbs, "pct_of_copy": 100 * gbs / ceiling})
        print(f"  page copy {n:4d} pages x {L:2d} layers {ms * 1e3:9.1f} us {gbs:8.0f} GB/s "
              f"({100 * gbs / ceiling:3.0f}%)")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="run the script on CPU under the Triton interpreter with tiny sizes")
    ap.add_argument("--no-sweep", action="store_true",
                    help="time the wrappers' default launch configurations only")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    opts = ap.parse_args()
    if opts.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before kernels (and its @triton.jit) is imported
    elif not torch.cuda.is_available():
        print("bench/kernels.py needs a CUDA GPU and torch sees none; nothing was measured. "
              "The kernels' CPU checks are `pytest tests/kernels` (Triton interpreter); "
              "`python bench/kernels.py --smoke` runs this script on CPU with tiny sizes.",
              file=sys.stderr)
        return 2
    elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the benchmark times compiled kernels", file=sys.stderr)
        return 2
    import triton

    import agentlang.kernels as kernels  # only now: TRITON_INTERPRET is read when its kernels are defined
    from bench.kernel_checks import CheckLog, run_checks
    from bench.kernel_sweep import sweep, sweep_splits

    z = SMOKE if opts.smoke else GPU
    t0 = time.time()
    torch.manual_seed(0)
    if opts.smoke:
        name, sms = "cpu (Triton interpreter, smoke run: timings are meaningless)", 1
    else:
        props = torch.cuda.get_device_properties(0)
        name, sms = props.name, props.multi_processor_count
    print(f"device: {name}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else HERE / "results"
    result = {
        "device": name, "sms": sms, "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "checks": [], "errors": [],
    }
    state = {"ceiling": float("nan"), "best": {"decode": {}, "extend": {}}, "split_rule": None}

    def save() -> None:
        result["seconds"] = time.time() - t0
        if not opts.smoke:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "kernels.json").write_text(json.dumps(result, indent=1))

    def checks() -> None:
        result["checks"] = run_checks(kernels, z.check_len, z.device)

    def ceiling() -> None:
        state["ceiling"] = result["copy_bandwidth_GBps"] = copy_bandwidth(z)
        print(f"\ndevice copy bandwidth ({z.copy_bytes >> 20} MiB D2D, read + write): "
              f"{state['ceiling']:.0f} GB/s", flush=True)

    def launch_sweep(which: tuple[str, ...]) -> None:
        log = CheckLog()
        best = sweep(kernels, HEADS, z.sweep_decode, z.sweep_extend, z.check_len, z.device, log,
                     z.sweep_limit, which)
        result["checks"] = result["checks"] + list(log)
        result.setdefault("sweep", []).extend(best.pop("rows"))
        for kind in which:
            state["best"][kind] = best[kind]
        result["chosen"] = {k: {h: c._asdict() for h, c in v.items()}
                            for k, v in state["best"].items()}

    def split_sweep() -> None:
        rule, rows = sweep_splits(kernels, HEADS, state["best"]["decode"], z.batches,
                                  z.split_contexts, z.max_decode_tokens, sms, z.device,
                                  z.sweep_limit)
        result["split_sweep"] = rows
        result["chosen_split_rule"] = {"waves": rule[0], "min_tokens": rule[1]}
        state["split_rule"] = rule

    sections = {
        "checks": checks,
        "ceiling": ceiling,
        "sweep-decode": lambda: launch_sweep(("decode",)),
        "sweep-extend": lambda: launch_sweep(("extend",)),
        "sweep-splits": split_sweep,
        "decode": lambda: result.__setitem__("decode", bench_decode(
            kernels, z, state["ceiling"], sms, state["best"]["decode"], state["split_rule"])),
        "extend": lambda: result.__setitem__("extend", bench_extend(
            kernels, z, state["best"]["extend"])),
        "kv": lambda: result.__setitem__("kv_ops", bench_kv_ops(kernels, z, state["ceiling"])),
    }
    chosen = opts.sections.split(",")
    if opts.no_sweep:
        chosen = [c for c in chosen if not c.startswith("sweep")]
    unknown = sorted(set(chosen) - set(sections))
    if unknown:
        ap.error(f"--sections: unknown {unknown}; choose from {','.join(SECTIONS)}")
    sections = [(name, sections[name]) for name in SECTIONS if name in chosen]
    for title, section in sections:
        try:
            section()
        except Exception as e:  # record it, keep what was measured, go on with the next section
            traceback.print_exc()
            result["errors"].append({"section": title, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(f"SECTION FAILED: {title}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        save()
    if not opts.smoke:
        print(f"\nwrote {out_dir / 'kernels.json'}")
    print(f"done in {result['seconds']:.0f} s")
    failed = [c["check"] for c in result["checks"] if not c["ok"]]
    if failed:
        print(f"FAILED checks: {failed}", file=sys.stderr)
    return 1 if failed or result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
