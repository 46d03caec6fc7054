"""Radix prefix cache micro-benchmark: match / insert / evict on a ~100k-node tree.

Runs the same workload on two checkouts side by side, each in its own process, so a change
to ``runtime/cache/radix_cache.py`` is measured against the code it replaces:

    python bench/radix.py --before /work/main          # this checkout vs /work/main
    python bench/radix.py --quick                       # small tree, this checkout only

Workload (page_size 1, seeded): ``--keys`` random keys of 24–40 tokens over 8 first tokens
and a 64-token vocabulary, so keys share prefixes and each insert adds a leaf and usually a
split (76k keys make a ~100k-node tree). Timed phases:

* insert — every key, as a finishing request hands its pages to the tree;
* match  — ``--matches`` lookups of stored keys (the scheduler's admission path: keys come
  from the runtime's own validated ids, so a checkout with ``TokenKey`` passes one);
* evict  — ``--evictions`` calls of ``evict(1)``, the scheduler's reserve loop under pressure.

Prints microseconds per operation and after/before ratios; ``--out`` writes JSON (a quick
run writes nothing unless asked).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def workload(keys: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(8)] + [rng.randrange(64) for _ in range(rng.randrange(23, 40))]
            for _ in range(keys)]


def measure(keys: int, matches: int, evictions: int) -> dict:
    """Run the phases on the ``runtime`` package this process imports."""
    from agentlang.runtime.cache import radix_cache
    from agentlang.runtime.cache.page_allocator import PageAllocator

    as_key = getattr(radix_cache, "TokenKey", None)
    trusted = as_key.trusted if as_key is not None else list
    data = workload(keys)
    alloc = PageAllocator(sum(len(k) for k in data))
    cache = radix_cache.RadixCache(alloc, 1)
    t0 = time.perf_counter()
    for k in data:
        pages = alloc.allocate(len(k))
        cache.release_into_cache(trusted(k), pages)
    t_insert = time.perf_counter() - t0
    nodes = sum(1 for r in cache.roots().values() for _ in _walk(r)) - len(cache.roots())
    rng = random.Random(1)
    probes = [trusted(data[rng.randrange(keys)]) for _ in range(matches)]
    t0 = time.perf_counter()
    for k in probes:
        cache.match_prefix(k, record=False)
    t_match = time.perf_counter() - t0
    t0 = time.perf_counter()
    freed = sum(cache.evict(1) for _ in range(evictions))
    t_evict = time.perf_counter() - t0
    cache.check_integrity()
    return {"source": str(Path(radix_cache.__file__).parent.parent), "nodes": nodes,
            "insert_us": 1e6 * t_insert / keys, "match_us": 1e6 * t_match / matches,
            "evict_us": 1e6 * t_evict / evictions, "evicted_pages": freed}


def _walk(root):
    stack = [root]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children.values())


def run_in(checkout: Path, args: argparse.Namespace) -> dict:
    """``measure`` in a fresh process importing ``runtime`` from ``checkout``."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--keys", str(args.keys),
           "--matches", str(args.matches), "--evictions", str(args.evictions)]
    out = subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, help="checkout whose runtime/ is the baseline")
    ap.add_argument("--keys", type=int, default=76_000)
    ap.add_argument("--matches", type=int, default=20_000)
    ap.add_argument("--evictions", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="2k keys, this checkout only")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.keys, args.matches, args.evictions = 2000, 2000, 50
    if args.child:
        print(json.dumps(measure(args.keys, args.matches, args.evictions)))
        return
    runs = {"after": run_in(ROOT, args)}
    if args.before is not None:
        runs["before"] = run_in(args.before.resolve(), args)
    print(f"{'':8} {'source':32} {'nodes':>7} {'insert us':>10} {'match us':>9} {'evict us':>9}")
    for name, r in runs.items():
        print(f"{name:8} {r['source'][-32:]:32} {r['nodes']:7d} {r['insert_us']:10.2f} "
              f"{r['match_us']:9.2f} {r['evict_us']:9.2f}")
    if "before" in runs:
        b, a = runs["before"], runs["after"]
        runs["speedup"] = {op: b[f"{op}_us"] / a[f"{op}_us"] for op in ("insert", "match", "evict")}
        print("speedup (before / after): " + ", ".join(
            f"{op} {x:.2f}x" for op, x in runs["speedup"].items()))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(runs, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
