"""The native quantized matmul alone: milliseconds a call and GB/s of weights read, per kind and
number of activation rows (a round's fastest call, the median over rounds), on random blocks
(``tests.support.gguf_files.random_blocks``). Shapes are the ~1.1B Llama of
``bench/cpu_kquants.py``: ffn up (8192 x 2048) and ffn down (2048 x 8192). Q4_0 blocks of the
same shapes run beside the K-quants (a control when only the K-quant kernel changed).
``--footprint-mb`` cycles through copies of each weight so that they come from memory, as a
model's decode reads them, instead of the caches.

Each round runs in a fresh process; ``--compare DIR`` alternates rounds of this checkout and
of another (e.g. a ``git worktree`` of the commit before a kernel change), one at a time, and
prints this tree's speed over that tree's for each row (this machine kind's speed drifts by
tens of percent within minutes: only alternated rounds count).

    .venv/bin/python bench/kquant_matmul.py --compare /tmp/base     # bench/results/kquant_matmul.json
    .venv/bin/python bench/kquant_matmul.py --footprint-mb 128 --kinds Q4_K Q4_0 --rows 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.before_after import own_code  # noqa: E402

SHAPES = {"up 8192x2048": (8192, 2048), "down 2048x8192": (2048, 8192)}
KINDS = ("Q4_K", "Q6_K", "Q5_K", "Q4_0")
ROWS = (1, 8, 64)


def linear(lib, qtype: str, N: int, K: int):
    """A native linear of ``qtype`` over random blocks ``[N, K]``, and its weight bytes."""
    import numpy as np

    from agentlang.runtime.quant.kblock_linear import KBlockLinear
    from agentlang.runtime.quant.kquant import split_kblocks
    from agentlang.runtime.weights.gguf_weights import block_linear

    if qtype == "Q4_0":
        import gguf

        w = np.random.default_rng(0).standard_normal((N, K)).astype(np.float32)
        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
        return block_linear(lib, [(raw, qtype)]), raw.nbytes
    from tests.support.gguf_files import random_blocks

    raw = random_blocks(qtype, N, K)
    return KBlockLinear(lib, split_kblocks(raw, qtype)), raw.nbytes


def measure(seconds: float, footprint_mb: float = 0.0, kinds=KINDS, rows=ROWS) -> list[dict]:
    import torch

    from agentlang.runtime.quant.native import kquant_library

    lib = kquant_library()
    if lib is None:
        raise SystemExit("no native build with K-quant kernels runs here")
    out = []
    for shape, (N, K) in SHAPES.items():
        for qtype in kinds:
            lin, nbytes = linear(lib, qtype, N, K)
            # copies to cycle through, so the weights come from memory, not the caches
            lins = [lin] + [linear(lib, qtype, N, K)[0]
                            for _ in range(int(footprint_mb * 1e6 // nbytes))]
            for T in rows:
                x = torch.randn(T, K)
                lin(x)
                times, end = [], time.perf_counter() + seconds
                while time.perf_counter() < end or len(times) < 5:
                    w = lins[len(times) % len(lins)]
                    t0 = time.perf_counter()
                    w(x)
                    times.append(time.perf_counter() - t0)
                ms = min(times) * 1e3          # the best call: other tenants' noise only adds
                out.append({"shape": shape, "kind": qtype, "rows": T, "ms": round(ms, 4),
                            "weight_GBps": round(nbytes / ms / 1e6, 2),
                            "GMACps": round(N * K * T / ms / 1e6, 2)})
    return out


def run_tree(root: Path, args: argparse.Namespace) -> list[dict]:
    """One round of :func:`measure` in a fresh process of checkout ``root``, on its own code
    (:func:`bench.before_after.own_code`)."""
    run = subprocess.run([sys.executable, str(root / "bench/kquant_matmul.py"), "--json",
                          "--seconds", str(args.seconds), "--footprint-mb",
                          str(args.footprint_mb), "--kinds", *args.kinds, "--rows",
                          *map(str, args.rows)], cwd=own_code(root), capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=str(root)))
    return json.loads(run.stdout.strip().splitlines()[-1])


def medians(rounds: list[list[dict]]) -> list[dict]:
    """Each row's median over the rounds of its fastest call's milliseconds (rows in
    :func:`measure`'s order)."""
    out = []
    for rows in zip(*rounds):
        row = dict(rows[0])
        row["ms"] = statistics.median(r["ms"] for r in rows)
        row["ms_rounds"] = [r["ms"] for r in rows]
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=0.3, help="timing a row (its fastest call)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds a tree, the trees alternating")
    ap.add_argument("--compare", type=Path, help="another checkout's root: run there too")
    ap.add_argument("--footprint-mb", type=float, default=0.0,
                    help="cycle through copies of each weight holding this many MB (e.g. 4x "
                         "the L3 cache: weights streamed from memory, as a model's decode reads "
                         "them); default 0: one weight, cache-resident")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    ap.add_argument("--json", action="store_true", help="print the rows as JSON only (internal)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/kquant_matmul.json")
    args = ap.parse_args()
    if args.json:
        print(json.dumps(measure(args.seconds, args.footprint_mb, args.kinds, args.rows)))
        return
    trees = [ROOT] + ([args.compare] if args.compare else [])
    rounds: list[list[list[dict]]] = [[] for _ in trees]
    for r in range(args.rounds):        # A B A B ...: drift of the machine hits both alike
        for t, root in enumerate(trees):
            rounds[t].append(run_tree(root, args))
        print(f"  round {r + 1}/{args.rounds} done", flush=True)
    here = medians(rounds[0])
    result = {"cpus": os.cpu_count(), "rounds": args.rounds, "footprint_mb": args.footprint_mb,
              "here": here}
    print(f"this tree ({ROOT}), medians of {args.rounds} rounds:")
    for a in here:
        print(f"  {a['shape']:16s} {a['kind']:5s} rows {a['rows']:3d}: {a['ms']:8.3f} ms  "
              f"{a['weight_GBps']:6.2f} GB/s (last round)")
    if args.compare:
        there = medians(rounds[1])
        result["compare"] = {"tree": str(args.compare), "rows": there}
        print(f"this tree's speed / {args.compare}'s (median ms over median ms):")
        for a, b in zip(here, there):
            print(f"  {a['shape']:16s} {a['kind']:5s} rows {a['rows']:3d}: "
                  f"{b['ms'] / a['ms']:5.2f}x  ({b['ms']:.3f} -> {a['ms']:.3f} ms)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
