"""Launch-configuration sweep of ``bench/kernels.py``: each candidate (tile sizes, warps,
pipeline stages) of decode and extend attention is checked against the float64 reference, then
timed on a few target-sized cells; the fastest correct candidate per head configuration is what
the tables use. The wrappers' defaults are always among the candidates."""

from __future__ import annotations

import math
import traceback

import torch

from bench.kernel_checks import CheckLog, decode_case, extend_case
from bench.kernel_util import PAGE, bench_ms, extend_inputs, new_kv

# (block_n, num_warps, num_stages)
DECODE_CANDIDATES = ((64, 4, 2), (64, 4, 4), (128, 4, 2), (128, 8, 3), (32, 2, 3), (32, 2, 4),
                     (64, 2, 3), (64, 2, 4))
# (block_m, block_n, num_warps, num_stages, tma, lazy_rescale); extend is timed as the engine
# calls it, with the new tokens' K/V passed contiguously (``tma`` loads those tiles through TMA).
# The contiguous loads need no page-table stage, so at equal num_stages they buffer one tile
# more than the paged ones (bench/kernel_compile.py): the 2-stage launches hold the paged
# 3-stage launches' shared memory. GQA packing (measured: no gain) is left out.
EXTEND_CANDIDATES = ((64, 64, 4, 3, False, False), (64, 64, 4, 4, False, False),
                     (64, 32, 4, 3, False, False), (64, 32, 4, 2, False, False),
                     (64, 64, 4, 2, False, False), (128, 64, 8, 3, False, False),
                     (128, 128, 8, 3, False, False),
                     (64, 32, 4, 3, True, False), (64, 32, 4, 2, True, False),
                     (64, 64, 4, 2, True, False), (64, 64, 4, 3, True, False),
                     (128, 64, 8, 2, True, False), (128, 64, 8, 3, True, False),
                     (128, 128, 8, 3, True, False),
                     (64, 32, 4, 3, False, True), (64, 64, 4, 3, False, True),
                     (64, 32, 4, 3, True, True), (64, 64, 4, 2, True, True),
                     (128, 64, 8, 2, True, True))


def extend_candidates(kernels) -> list:
    """:data:`EXTEND_CANDIDATES` as ``kernels.LaunchConfig`` objects."""
    return [kernels.LaunchConfig(block_m=m, block_n=n, num_warps=w, num_stages=st, tma=tma,
                                 lazy_rescale=lazy)
            for m, n, w, st, tma, lazy in EXTEND_CANDIDATES]


def decode_cell_ms(kernels, hq, hkv, d, batch, ctx, dev, config, num_splits=None) -> float:
    """Time of one decode launch: ``batch`` sequences of ``ctx`` tokens, bf16, shuffled pages."""
    n = ctx // PAGE
    pages = batch * n + 1
    kc = torch.randn(pages, PAGE, hkv, d, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(pages, device=dev)[: batch * n].view(batch, n).int()
    sl = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, hq, d, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    return bench_ms(lambda: kernels.decode_attention(
        q, kc, vc, table, sl, d**-0.5, out=out, max_seq_len=ctx, check_indices=False,
        config=config, num_splits=num_splits), dev)


def extend_cell_ms(kernels, hq, hkv, d, batch, prefix, new, dev, config) -> float:
    args, _ = extend_inputs([prefix] * batch, [new] * batch, hq, hkv, d, torch.bfloat16, dev)
    out, extra = torch.empty_like(args[0]), new_kv(args)
    return bench_ms(lambda: kernels.extend_attention(
        *args, out=out, max_extend_len=new, check_indices=False, config=config, **extra), dev)


def sweep(kernels, heads: dict, decode_cells, extend_cells, check_len: int, dev: str,
          log: CheckLog, limit: int | None = None,
          which: tuple[str, ...] = ("decode", "extend")) -> dict:
    """Returns ``{"decode": {head name: best}, "extend": {...}, "rows": [...]}``, each best a
    ``kernels.LaunchConfig``, for the kernels in ``which``; ``limit`` keeps the first
    candidates only (smoke runs)."""
    gen = torch.Generator(device=dev).manual_seed(1)
    rows, best = [], {"decode": {}, "extend": {}}
    kinds = {
        "decode": ([kernels.LaunchConfig(*c) for c in DECODE_CANDIDATES], decode_cells,
                   kernels.default_decode_config),
        "extend": (extend_candidates(kernels),
                   extend_cells, kernels.default_extend_config),
    }
    for kind, (candidates, cells, default) in kinds.items():
        if kind not in which:
            continue
        print(f"\n{kind} launch sweep, bf16 (ms per cell; geometric mean relative to the default)",
              flush=True)
        for name, (hq, hkv, d) in heads.items():
            dflt = default(d)
            cands = [dflt] + [c for c in candidates if c != dflt][: None if limit is None else
                                                                   limit - 1]
            times = {}
            for cfg in cands:
                label = f" {cfg.label()}"
                try:
                    if kind == "decode":
                        ok = decode_case(kernels, log, hq, hkv, d, PAGE, torch.bfloat16,
                                         check_len, gen, dev, config=cfg, label=label)
                        ms = [decode_cell_ms(kernels, hq, hkv, d, *c, dev, cfg) for c in cells]
                    else:
                        ok = extend_case(kernels, log, hq, hkv, d, torch.bfloat16, check_len,
                                         gen, dev, config=cfg, label=label, with_new_kv=True)
                        ms = [extend_cell_ms(kernels, hq, hkv, d, *c, dev, cfg) for c in cells]
                except Exception as e:  # a candidate that does not compile or launch is skipped
                    traceback.print_exc()
                    rows.append({"kind": kind, "heads": name, "config": cfg._asdict(),
                                 "error": f"{type(e).__name__}: {e}"[:500]})
                    continue
                if ok:
                    times[cfg] = ms
                rows.append({"kind": kind, "heads": name, "config": cfg._asdict(),
                             "cells": [list(c) for c in cells], "ms": ms, "correct": ok})
            if dflt not in times:
                raise RuntimeError(f"{kind} {name}: the default launch {dflt} failed its check")
            score = {c: math.exp(sum(math.log(a / b) for a, b in zip(t, times[dflt])) / len(t))
                     for c, t in times.items()}
            for c, t in times.items():
                mark = "default" if c == dflt else ""
                print(f"  {name:24s} {c.label():18s} "
                      + " ".join(f"{x:8.3f}" for x in t) + f"  x{score[c]:.3f} {mark}", flush=True)
            best[kind][name] = min(times, key=score.get)
            print(f"  -> {name}: {best[kind][name].label()} "
                  f"(x{score[best[kind][name]]:.3f} of the default's time)", flush=True)
    best["rows"] = rows
    return best


# (waves, min_tokens) rules for the decode split count; the first is the wrapper's default
SPLIT_RULES = ((4, 256), (8, 256), (16, 256), (16, 128), (32, 128))


def sweep_splits(kernels, heads: dict, configs: dict, batches, contexts, max_tokens: int,
                 sms: int, dev: str, limit: int | None = None) -> tuple[tuple[int, int], list]:
    """Time decode under each split rule on the (batch, context) grid; returns the rule with the
    best geometric-mean time over the grid (both head configurations) and the rows."""
    rules = SPLIT_RULES[: None if limit is None else limit]
    rows, logsum = [], dict.fromkeys(rules, 0.0)
    print("\ndecode split-count rules (waves, min tokens per split): ms per cell", flush=True)
    for name, (hq, hkv, d) in heads.items():
        cfg = configs.get(name) or kernels.default_decode_config(d)
        for B in batches:
            for ctx in contexts:
                if B * ctx > max_tokens:
                    continue
                timed: dict[int, float] = {}
                for rule in rules:
                    n = kernels.choose_num_splits(ctx, B, hkv, sms, *rule)
                    if n not in timed:
                        timed[n] = decode_cell_ms(kernels, hq, hkv, d, B, ctx, dev, cfg,
                                                  num_splits=n)
                    logsum[rule] += math.log(timed[n])
                    rows.append({"heads": name, "batch": B, "context": ctx, "waves": rule[0],
                                 "min_tokens": rule[1], "num_splits": n, "ms": timed[n]})
                print(f"  {name:24s} B{B:<4d} ctx {ctx:6d}: " + "  ".join(
                    f"{n:2d} splits {ms:7.3f}" for n, ms in sorted(timed.items())), flush=True)
    best = min(rules, key=logsum.get)
    for rule in rules:
        print(f"  rule waves={rule[0]:2d} min_tokens={rule[1]:3d}: geometric-mean time "
              f"x{math.exp((logsum[rule] - logsum[rules[0]]) / max(1, len(rows) // len(rules))):.3f}"
              f" of the default{'  <- best' if rule == best else ''}", flush=True)
    return best, rows
