"""Two commits' benchmarks interleaved on one machine: is a change within N % of its base?

Each commit is checked out into its own git worktree (``--work``); the commit's own copy of
each bench script runs from there with that worktree first on ``PYTHONPATH`` (a commit that
installs ``runtime/`` as ``agentlang.runtime`` gets the two folders linked into its
``agentlang/``, so it imports its own code, not this checkout's editable install). Rounds run
base, after, after, base, base, after, after, base ... (ABBA: a drift of the machine over the run hits both
alike), and for every figure the ratio after / base of the medians over rounds is printed with
each side's spread (max / min - 1), and written as JSON.

    .venv/bin/python bench/before_after.py --base 385176a --after a7737e4 --rounds 4
    .venv/bin/python bench/before_after.py --base A --after B --benches cpu_local --rounds 6

(cpu_local needs llama-cpp-python: `make bench-install`, or with llama.cpp already built by
`bench/install_peers.sh llama`: `CMAKE_ARGS=-DLLAMA_BUILD=OFF pip install llama-cpp-python` and
`LLAMA_CPP_LIB_PATH=.peers/llama.cpp/build/bin`.)

The benches and the figures read from their JSON (higher is better for every figure; a
program's seconds are read as runs per second):

* ``throughput``: ``bench/throughput.py --quick``: agentlang's out tok/s per dtype and
  workload, HF ``generate``'s beside it (the same code on both sides: the machine's drift);
* ``programs``: ``bench/programs.py --quick``: 1 / seconds of each program;
* ``cpu_local``: ``bench/cpu_local.py --skip quality invariance``: batch-1 decode and
  prefill-512 tok/s per compute dtype, llama.cpp's beside them (drift again).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def worktree(rev: str, work: Path) -> Path:
    """A detached worktree of ``rev`` under ``work`` (reused when it exists)."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.strip()
    path = work / sha
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO,
                       check=True, capture_output=True)
    return own_code(path)


def own_code(path: Path) -> Path:
    """``path``, a checkout run with itself first on ``PYTHONPATH``, made to import its own
    ``runtime/`` and ``kernels/``: a checkout that installs them as ``agentlang.runtime`` /
    ``agentlang.kernels`` gets them linked into its ``agentlang/`` (else the editable install
    of this checkout would map them here). This checkout itself is left as it is."""
    if path.resolve() == REPO.resolve():
        return path
    for name in ("runtime", "kernels"):   # commits that map the folders into agentlang
        link = path / "agentlang" / name
        if (path / "setup.py").exists() and "agentlang.runtime" in (path / "setup.py").read_text() \
                and not link.exists():
            link.symlink_to(Path("..") / name)
    return path


def run_bench(tree: Path, bench: str, out: Path) -> dict:
    """One run of ``bench`` from ``tree``; its figures (name -> value, higher is better)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    if bench == "throughput":
        cmd = ["bench/throughput.py", "--quick", "--out", str(out / "t.json")]
    elif bench == "programs":
        cmd = ["bench/programs.py", "--quick", "--out", str(out / "p.json")]
    else:
        cmd = ["bench/cpu_local.py", "--skip", "quality", "invariance", "--out-dir", str(out)]
    done = subprocess.run([sys.executable, *cmd], cwd=tree, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{bench} from {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return figures(bench, out)


def figures(bench: str, out: Path) -> dict[str, float]:
    """The figures of one run's JSON (see the module docstring)."""
    got: dict[str, float] = {}
    if bench == "throughput":
        for run in json.loads((out / "t.json").read_text())["runs"]:
            key = f"{run['dtype']} {run['workload']}"
            got[f"{key} agentlang tok/s"] = run["agentlang"]["tokens_per_s"]
            got[f"{key} HF tok/s (drift)"] = run["hf"]["tokens_per_s"]
    elif bench == "programs":
        for run in json.loads((out / "p.json").read_text())["runs"]:
            got[f"{run['program']} agentlang 1/s"] = 1.0 / run["agentlang_s"]
    else:
        speed = json.loads((out / "cpu_local_speed.json").read_text())
        for dtype in ("float32", "bfloat16"):
            s = speed[f"speed_{dtype}"]
            for what in ("decode", "prefill"):
                got[f"{dtype} {what} agentlang tok/s"] = s[f"al_{what}"]
                got[f"{dtype} {what} llama.cpp tok/s (drift)"] = s[f"cpp_{what}"]
    return got


def order(rounds: int) -> list[int]:
    """0 = base, 1 = after: A B B A A B B A ... (2 * rounds runs)."""
    return [(0, 1, 1, 0)[i % 4] for i in range(2 * rounds)]


def summary(rows: dict[str, list[list[float]]]) -> dict[str, dict]:
    """name -> medians, ratio after / base, each side's spread."""
    out = {}
    for name, (base, after) in rows.items():
        mb, ma = statistics.median(base), statistics.median(after)
        out[name] = {"base": base, "after": after, "base_median": mb, "after_median": ma,
                     "ratio": ma / mb, "base_spread": max(base) / min(base) - 1,
                     "after_spread": max(after) / min(after) - 1}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each side per bench")
    ap.add_argument("--benches", nargs="+", default=["throughput", "programs", "cpu_local"],
                    choices=["throughput", "programs", "cpu_local"])
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "agentlang-before-after"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "before_after.json"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    trees = [worktree(args.base, work), worktree(args.after, work)]
    result = {"base": trees[0].name, "after": trees[1].name, "rounds": args.rounds, "benches": {}}
    for bench in args.benches:
        rows: dict[str, list[list[float]]] = {}
        for i, side in enumerate(order(args.rounds)):
            t = time.perf_counter()
            with tempfile.TemporaryDirectory() as out:
                got = run_bench(trees[side], bench, Path(out))
            for name, value in got.items():
                rows.setdefault(name, [[], []])[side].append(value)
            print(f"[{bench} {i + 1}/{2 * args.rounds}] {trees[side].name} "
                  f"{time.perf_counter() - t:.0f}s " +
                  " ".join(f"{v:.1f}" for v in got.values()), flush=True)
        result["benches"][bench] = summary(rows)
        for name, s in result["benches"][bench].items():
            print(f"  {bench:10s} {name:42s} base {s['base_median']:8.2f} "
                  f"after {s['after_median']:8.2f}  after/base {s['ratio']:.3f}  "
                  f"spread {s['base_spread']:.0%} / {s['after_spread']:.0%}", flush=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
