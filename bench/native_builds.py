"""The native builds this CPU runs, side by side in one process: one Q4 / Q8 linear of the
embedded model's shapes (``BlockLinear`` over ``gguf``-quantized random weights) at 1 to 512
rows, each build's library on the same weights and activations, best of 2 rounds.

On a CPU with AMX tiles this is the AMX build (``avx512/panel.h``: weights in panels, VNNI
with a weight row a lane under 4 rows, tiles from 4) against the AVX-512 VNNI build it extends.

    .venv/bin/python bench/native_builds.py [--rows 1 2 4 9 17 64 512] [--kquants] [--out PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.output import write_results  # noqa: E402

SHAPES = (("Q4_1", 3072, 576), ("Q4_1", 576, 1536), ("Q8_0", 49152, 576))   # gate|up, down, head
K_SHAPES = (("Q4_K", 5632, 2048), ("Q6_K", 2048, 5632))   # a ~1.1B Llama's gate, down


def best_ms(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    import gguf

    import agentlang.runtime.quant.native as native
    from agentlang.runtime.quant.kblock_linear import KBlockLinear
    from agentlang.runtime.quant.kquant import split_kblocks
    from agentlang.runtime.weights.gguf_weights import block_linear
    from tests.support.gguf_files import random_blocks

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 3, 4, 9, 17, 64, 512])
    ap.add_argument("--kquants", action="store_true",
                    help="K-quant linears of a ~1.1B Llama instead (random super-blocks)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    libs = {i.name: native.build_library(i) for i in native.runnable_isas()}
    torch.manual_seed(0)
    rows = []
    for qtype, N, K in K_SHAPES if args.kquants else SHAPES:
        if args.kquants:
            raw = random_blocks(qtype, N, K, seed=1)
            lins = {name: KBlockLinear(lib, split_kblocks(raw, qtype)) for name, lib in libs.items()}
        else:
            raw = gguf.quants.quantize(torch.randn(N, K).numpy(), gguf.GGMLQuantizationType[qtype])
            lins = {name: block_linear(lib, [(raw, qtype)]) for name, lib in libs.items()}
        for M in args.rows:
            x = torch.randn(M, K)
            reps = min(200, max(3, int(2e8 / (M * N * K))))
            ms = {name: min(best_ms(lambda: lin(x), reps) for _ in range(2))
                  for name, lin in lins.items()}
            row = {"kind": qtype, "N": N, "K": K, "rows": M,
                   "ms": {n: round(v, 4) for n, v in ms.items()},
                   "gmac_s": {n: round(M * N * K / v / 1e6, 1) for n, v in ms.items()}}
            rows.append(row)
            print(f"{qtype} {N}x{K} rows {M:4d}: " + "  ".join(
                f"{n} {v:8.3f} ms ({row['gmac_s'][n]:6.1f} GMAC/s)" for n, v in ms.items()),
                flush=True)
    path = write_results("native_builds", {"builds": list(libs), "calls": rows}, args.out, False)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
