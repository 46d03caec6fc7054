"""`make bench`: run every benchmark in bench/ (GPU-only ones where a GPU exists), then redraw
the charts of docs/benchmarks.md. Results land in bench/results/*.json, charts in docs/img/.

    python bench/run_all.py [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (script, arguments for a full run, arguments for --quick)
BENCHES = [
    ("kv_memory.py", [], []),
    ("throughput.py", [], ["--quick", "--dtype", "float32"]),
    ("programs.py", [], ["--quick"]),
    ("structured.py", [], ["--quick"]),
    ("kv_quant.py", [], ["--quick"]),
    ("serve.py", [], ["--quick"]),
    ("dashboard.py", [], ["--quick"]),
]


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small workloads (minutes, not an hour)")
    args = ap.parse_args()
    benches = list(BENCHES)
    if has_cuda():
        benches.append(("kernels.py", [], []))
    else:
        print("bench/kernels.py skipped: no CUDA device (its numbers in docs/benchmarks.md come "
              "from a GPU run)")
    failed = []
    for script, full, quick in benches:
        cmd = [sys.executable, str(ROOT / "bench" / script)] + (quick if args.quick else full)
        print(f"\n=== {' '.join(cmd[1:])}", flush=True)
        t = time.perf_counter()
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            failed.append(script)
        print(f"=== {script}: {time.perf_counter() - t:.0f} s", flush=True)
    subprocess.run([sys.executable, str(ROOT / "bench" / "plot.py")], cwd=ROOT, check=True)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
