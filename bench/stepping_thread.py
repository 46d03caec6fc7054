"""The step's speed on the caller's thread vs on the engine's background thread, side by side.

Why: the server, streaming and every concurrent DSL program step on the background thread
(``Engine.start_background_loop``); it used to run at about half the caller-thread speed
(two libgomp pools on two cores throttle the workers' spin-wait: :mod:`agentlang.runtime.core.openmp_pool`).

Modes, interleaved in each round on one engine (greedy, ``ignore_eos``, blocking
``Engine.generate`` from the main thread):
  caller      the loop is not running: the main thread steps the engine;
  background  ``start_background_loop()``: the engine's thread steps, the main thread waits;
  background, pool held elsewhere
              the same, while another live thread has run one parallel torch op and so
              holds an OpenMP pool: the state every background step was in before the fix
              (the model loader's pool), reproduced without turning the fix off.
Workloads: one request (a 16-token prompt, ``--new-tokens`` new) and ``--requests`` of the
independent workload (bench.workloads.independent: 64-512 prompt tokens, 32-128 new).
Reported: output tok/s, medians over ``--rounds`` rounds; ratio background / caller.

    python bench/stepping_thread.py [--dtype float32 bfloat16] [--weights auto]
                                    [--rounds 5] [--requests 16] [--new-tokens 128] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.output import write_results  # noqa: E402
from bench.workloads import independent  # noqa: E402
from agentlang.runtime import Engine, SamplingParams  # noqa: E402

MODES = ("caller", "background", "background, pool held elsewhere")


class PoolHolder:
    """A live thread that ran one parallel torch op (so libgomp keeps a pool for it)."""

    def __init__(self):
        self._done = threading.Event()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        torch.randn(4_000_000).exp_()        # above the grain size: a parallel region
        self._ready.set()
        self._done.wait()

    def stop(self) -> None:
        self._done.set()
        self.thread.join()


def timed(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> float:
    """Output tok/s of one blocking ``generate`` of the whole list."""
    engine.flush_cache()
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - t
    return sum(len(o.token_ids) for o in outs) / wall


def run_mode(engine: Engine, mode: str, prompts, params) -> float:
    holder = None
    if mode != "caller":
        engine.start_background_loop()
        if mode == MODES[2]:
            holder = PoolHolder()
    try:
        return timed(engine, prompts, params)
    finally:
        if holder is not None:
            holder.stop()
        engine.shutdown()                 # back to caller stepping for the next mode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--weights", default="auto", choices=["auto", "dense", "int8"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, tiny workloads")
    ap.add_argument("--out", help="JSON output (default: bench/results/stepping_thread.json)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.requests, args.new_tokens = 1, 2, 8
    results = {"machine": {"torch_threads": torch.get_num_threads()},
               "weights": args.weights, "rounds": args.rounds, "dtypes": {}}
    for dtype in args.dtype:
        engine = Engine("default", dtype=dtype, weights=args.weights)
        tok = engine.tokenizer
        items = independent(tok, n_requests=args.requests)
        if args.quick:
            items = [type(it)(it.prompt_ids[:32], 4) for it in items]
        one = tok.encode("Write a long story about a dragon who learns to read.")
        workloads = {
            "batch-1": ([one], [SamplingParams(max_tokens=args.new_tokens, temperature=0,
                                               ignore_eos=True)]),
            "independent": ([it.prompt_ids for it in items],
                            [SamplingParams(max_tokens=it.max_new_tokens, temperature=0,
                                            ignore_eos=True) for it in items]),
        }
        timed(engine, *workloads["batch-1"])          # warm-up
        runs = {w: {m: [] for m in MODES} for w in workloads}
        for r in range(args.rounds):
            for w, (prompts, params) in workloads.items():
                for m in MODES:
                    runs[w][m].append(run_mode(engine, m, prompts, params))
                    print(f"{dtype} round {r + 1}/{args.rounds} {w:12s} {m:32s} "
                          f"{runs[w][m][-1]:7.1f} tok/s", flush=True)
        out = {}
        for w, by_mode in runs.items():
            med = {m: statistics.median(v) for m, v in by_mode.items()}
            out[w] = {"tok_per_s_median": med, "runs": by_mode,
                      "background_over_caller": med[MODES[1]] / med[MODES[0]],
                      "pool_held_over_caller": med[MODES[2]] / med[MODES[0]]}
        results["dtypes"][dtype] = out
        del engine
    print(f"\n{'dtype':9s} {'workload':12s} " + " ".join(f"{m:>14.14s}" for m in MODES)
          + "   bg/caller  held/caller")
    for dtype, out in results["dtypes"].items():
        for w, r in out.items():
            med = r["tok_per_s_median"]
            print(f"{dtype:9s} {w:12s} " + " ".join(f"{med[m]:14.1f}" for m in MODES)
                  + f"   {r['background_over_caller']:9.2f}  {r['pool_held_over_caller']:11.2f}")
    print("wrote", write_results("stepping_thread", results, args.out, args.quick))


if __name__ == "__main__":
    main()
