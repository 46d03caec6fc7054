"""What the HTTP front end costs one request: ``agentlang serve`` against the same engine
in-process, stepped on the caller's thread (issue 29: "HTTP / in-process >= 0.9 at batch 1").

The server (``bench.peers.start_agentlang``: weights auto, the chosen dtype) and an in-process
``Engine`` with the same settings live side by side; each round sends one non-streamed
``/v1/completions`` request of ``--new-tokens`` greedy ``ignore_eos`` tokens to the server, then
runs the same prompt through ``Engine.generate``, each timed end to end by the caller (tokens /
wall). Only one of them works at a time: the idle one sleeps. Medians over ``--rounds``.
With ``--clients N`` (the issue's second point: "and at 64 streaming clients") each round is
the independent workload of ``bench/workloads.py`` (N requests, 64–512-token prompts, 32–128
new tokens, fresh prompts every round) streamed by N concurrent clients (``bench.peers``' load
generator), against the same N prompts in one ``Engine.generate`` call; out tok/s.

    .venv/bin/python bench/http_overhead.py [--dtype float32] [--rounds 5] [--new-tokens 256]
    .venv/bin/python bench/http_overhead.py --clients 64 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.output import write_results  # noqa: E402
from bench.peers import start_agentlang, streamed  # noqa: E402
from bench.serve import stop_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--out", help="JSON output (default bench/results/http_overhead.json; "
                    "with --clients > 1: http_overhead_clients.json)")
    args = ap.parse_args()
    from agentlang.runtime import Engine, SamplingParams
    if args.clients > 1:
        return many_clients(args)

    server = start_agentlang(args.dtype, "auto", SimpleNamespace(kv_budget_mb=1024))
    eng = Engine("default", dtype=args.dtype, weights="auto", kv_budget_mb=1024,
                 max_batch_tokens=2048, max_running=64)
    prompt = eng.tokenizer.encode("Once upon a time")
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
    body = {"model": server.model, "prompt": prompt, "max_tokens": args.new_tokens,
            "temperature": 0, "ignore_eos": True}
    res: dict[str, list[float]] = {"http": [], "in_process": []}
    try:
        with httpx.Client(base_url=server.url, timeout=3600) as c:
            c.post("/v1/completions", json={**body, "max_tokens": 4}).raise_for_status()
            eng.generate(prompt, SamplingParams(max_tokens=4, temperature=0))      # warm-ups
            for r in range(args.rounds):
                t = time.perf_counter()
                reply = c.post("/v1/completions", json=body)
                reply.raise_for_status()
                res["http"].append(reply.json()["usage"]["completion_tokens"]
                                   / (time.perf_counter() - t))
                t = time.perf_counter()
                out = eng.generate(prompt, params)
                res["in_process"].append(len(out.token_ids) / (time.perf_counter() - t))
                print(f"  round {r + 1}: HTTP {res['http'][-1]:.1f} tok/s, in-process "
                      f"{res['in_process'][-1]:.1f} tok/s", flush=True)
    finally:
        stop_server(server.proc)
        eng.shutdown()
    report(args, res, "http_overhead", "(caller thread)", new_tokens=args.new_tokens)


def report(args, res: dict[str, list[float]], name: str, what: str, **fields) -> None:
    """Medians of both sides' rounds, their ratio, written as ``name``'s JSON and printed."""
    med = {k: statistics.median(v) for k, v in res.items()}
    result = {"machine": f"{os.cpu_count()}-core {platform.machine()}",
              "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, weights auto)",
              "command": "python bench/http_overhead.py " + " ".join(sys.argv[1:]),
              "dtype": args.dtype, **fields, "rounds": res,
              "median_tok_s": med, "http_over_in_process": med["http"] / med["in_process"]}
    out = write_results(name, result, args.out, False)
    print(f"  HTTP / in-process {what}: {result['http_over_in_process']:.2f}")
    print(f"wrote {out}")


def many_clients(args) -> None:
    """``--clients N``: the independent workload over HTTP (N streams) vs in-process (the same
    N prompts each round, new ones every round)."""
    from agentlang.runtime import Engine, SamplingParams
    from bench.workloads import independent

    server = start_agentlang(args.dtype, "auto", SimpleNamespace(kv_budget_mb=1024))
    eng = Engine("default", dtype=args.dtype, weights="auto", kv_budget_mb=1024,
                 max_batch_tokens=2048, max_running=64)
    res: dict[str, list[float]] = {"http": [], "in_process": []}
    try:
        for r in range(args.rounds):
            items = independent(eng.tokenizer, args.clients, seed=1000 + r)
            res["http"].append(streamed(server, items, args.clients)["tokens_per_s"])
            eng.flush_cache()
            params = [SamplingParams(max_tokens=it.max_new_tokens, temperature=0,
                                     ignore_eos=True) for it in items]
            t = time.perf_counter()
            outs = eng.generate([it.prompt_ids for it in items], params)
            res["in_process"].append(sum(len(o.token_ids) for o in outs)
                                     / (time.perf_counter() - t))
            print(f"  round {r + 1}: HTTP {res['http'][-1]:.1f} tok/s, in-process "
                  f"{res['in_process'][-1]:.1f} tok/s", flush=True)
    finally:
        stop_server(server.proc)
        eng.shutdown()
    report(args, res, "http_overhead_clients", f"at {args.clients} clients",
           clients=args.clients)


if __name__ == "__main__":
    main()
