"""What the live dashboard costs the engine.

1. **Engine-thread cost per poll** (in-process, embedded model): the engine runs a shared-prefix
   workload step by step; once a second of wall time the same thread takes the dashboard's
   snapshot (``Engine.snapshot``, what ``/dashboard/data`` takes under the step lock). Reports
   the snapshot's lock-held time against the mean step time: at 1 Hz the engine loses
   ``cost / 1000 ms`` of its time. Also the snapshot of a 10k-node radix tree (bounded by the
   page's ``max_nodes``).
2. **Throughput with the page open vs closed** (real server subprocess, Chromium polling at
   1 Hz through Playwright): output tokens/s of the same workload, rounds alternating closed /
   open so that machine load hits both alike.

    python bench/dashboard.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "server"))

PREFIX = "You are a meticulous assistant for a bicycle repair shop. Keep answers short. " * 4


def engine_cost(n_requests: int, max_tokens: int) -> dict:
    import threading

    from dashboard_browser import synthetic_cache

    from agentlang.runtime import Engine, SamplingParams
    from agentlang.runtime.cache.snapshot import snapshot_tree

    eng = Engine(page_size=16, kv_budget_mb=256)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    prompts = [PREFIX + f"Question {i}: what now?" for i in range(n_requests)]
    eng.generate(prompts[:1], params)                       # warm-up
    # no background loop: the generating thread runs the steps itself; this thread takes the
    # dashboard's snapshot once a second, between two steps (under the step lock)
    worker = threading.Thread(target=eng.generate, args=(prompts, params))
    passes0, t0 = eng.metrics()["forward_passes"], time.perf_counter()
    worker.start()
    snaps = []
    while worker.is_alive():
        worker.join(timeout=1.0)
        if worker.is_alive():
            snaps.append(eng.snapshot(max_nodes=500).cost_ms)
    elapsed = time.perf_counter() - t0
    steps = eng.metrics()["forward_passes"] - passes0
    # a 10k-node tree, snapshotted as the page asks (500 nodes) and whole; wall and CPU time
    # (CPU time is what this thread used, whatever else the machine runs)
    cache = synthetic_cache(10_000)
    big = {}
    for limit in (500, 1500, 10_000):
        wall, cpu = [], []
        for _ in range(7):
            t, c = time.perf_counter(), time.thread_time()
            snapshot_tree(cache, limit)
            wall.append((time.perf_counter() - t) * 1000)
            cpu.append((time.thread_time() - c) * 1000)
        big[limit] = {"wall_ms": statistics.median(wall), "cpu_ms": statistics.median(cpu)}
    step_ms = elapsed * 1000 / steps
    snap_ms = statistics.median(snaps) if snaps else float("nan")
    return {"steps": steps, "mean_step_ms": step_ms, "snapshots": len(snaps),
            "snapshot_ms_median": snap_ms, "snapshot_ms_max": max(snaps, default=float("nan")),
            "engine_time_share_at_1hz_pct": 100 * snap_ms / 1000.0,
            "snapshot_vs_step_pct": 100 * snap_ms / step_ms,
            "tree10k_snapshot_ms": {str(k): v for k, v in big.items()}}


def served_throughput(rounds: int, n_requests: int, max_tokens: int) -> dict:
    import concurrent.futures as cf

    import httpx
    from dashboard_browser import chromium, open_dashboard, render_tree_ms, synthetic_tree
    from server_harness import start_server

    def workload(url: str) -> float:
        def one(i: int) -> int:
            r = httpx.post(url + "/generate", timeout=600, json={
                "text": PREFIX + f"Question {i}: what now?",
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0,
                                    "ignore_eos": True}})
            r.raise_for_status()
            return r.json()["meta_info"]["completion_tokens"]

        t = time.perf_counter()
        with cf.ThreadPoolExecutor(n_requests) as ex:
            tokens = sum(ex.map(one, range(n_requests)))
        return tokens / (time.perf_counter() - t)

    if chromium() is None:
        return {"skipped": "no chromium"}
    srv = start_server("--kv-budget-mb", "256")
    closed, opened, polls = [], [], []
    try:
        workload(srv.url)                                     # warm-up
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(rounds):
                closed.append(workload(srv.url))
                with open_dashboard(srv.url, Path(tmp) / "p") as page:
                    p0 = page.evaluate("window.dashboard.state.polls")
                    opened.append(workload(srv.url))
                    polls.append(page.evaluate("window.dashboard.state.polls") - p0)
            with open_dashboard(srv.url, Path(tmp) / "p") as page:
                render = render_tree_ms(page, synthetic_tree(10_000))
    finally:
        srv.stop()
    return {"closed_tok_s": closed, "open_tok_s": opened, "polls_while_open": polls,
            "open_over_closed": statistics.mean(opened) / statistics.mean(closed),
            "render_10k_tree_ms": render["total_ms"], "render_10k_nodes": render["nodes"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, toks, rounds = (8, 48, 2) if args.quick else (16, 96, 3)
    out = {"engine": engine_cost(n, toks), "served": served_throughput(rounds, n, toks),
           "workload": {"requests": n, "max_tokens": toks, "prefix_chars": len(PREFIX)}}
    print(json.dumps(out, indent=2))
    path = ROOT / "bench" / "results" / "dashboard.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
