"""Compile-time variants of this checkout's native build side by side in one process: each
variant is the build's sources compiled with its own ``-D`` flags, and the variants' calls
alternate round by round (the 2-core machines drift by tens of percent within minutes, so only
alternated rounds count). Prints each variant's median over rounds of its fastest call (ms) and
its speed relative to the first, per weight kind, shape (``bench/kquant_matmul.py``'s) and rows.

    .venv/bin/python bench/native_variants.py "base=;big=-DBLOCK_BYTES=1000000000" --rows 1 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.kquant_matmul import KINDS, SHAPES, linear  # noqa: E402


def build(spec: str, isa, out_dir: Path):
    """``name=flags`` → (name, the library compiled with those flags)."""
    from agentlang.runtime.quant import native

    name, _, flags = spec.partition("=")
    out = out_dir / f"lib_{name}.so"
    native.compile_library(isa, out, tuple(flags.split()))
    return name, native.QMatmulLibrary(out, isa)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", help="name=-DX=1 -DY=2;name2=... (the first is the reference)")
    ap.add_argument("--isa", default=None, help="build (default: the best this CPU runs)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 64])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import torch

    from agentlang.runtime.quant import native

    isa = next(i for i in native.runnable_isas() if args.isa in (None, i.name))
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        libs = dict(build(v, isa, Path(tmp)) for v in args.variants.split(";"))
        for shape, (N, K) in SHAPES.items():
            for qtype in args.kinds:        # 4 copies each: the weights come from memory
                lins = {n: [linear(lib, qtype, N, K)[0] for _ in range(4)] for n, lib in libs.items()}
                for T in args.rows:
                    x = torch.randn(T, K)
                    best = {n: [] for n in libs}
                    for _ in range(args.rounds):
                        for n in libs:
                            times = []
                            for i in range(max(8, 40 // T)):
                                t0 = time.perf_counter()
                                lins[n][i % 4](x)
                                times.append(time.perf_counter() - t0)
                            best[n].append(min(times) * 1e3)
                    med = {n: statistics.median(v) for n, v in best.items()}
                    ref = next(iter(med.values()))
                    print(f"{shape:16s} {qtype:5s} rows={T:3d} "
                          + " ".join(f"{n}={v:.3f}ms ({ref / v:.2f}x)" for n, v in med.items()),
                          flush=True)


if __name__ == "__main__":
    main()
