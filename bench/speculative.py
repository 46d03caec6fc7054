"""Model-free speculative decoding (``agentlang.runtime.speculative``) on agent turns, over HTTP.

One ``agentlang serve`` (the embedded model's GGUF kept quantized, float32 activations: the
default model path) answers every request; speculation is switched per request with the
``speculative`` field, so on and off run on the same server, interleaved round by round.
Workloads: ``bench/speculative_prompts.py`` (four copy-heavy turns and a free-form story,
fixed before any tuning), each rendered with the model's chat template, greedy, ``ignore_eos``,
``--new-tokens`` (256) each, non-streamed ``/v1/completions`` with the prompt as token ids
(warm prefix cache: the prompt is run once first, so the rates are decode rates):

- batch 1: one request; batch 8: eight concurrent requests of the workload, each with its
  own first line (``Request i of 8.``) so that their outputs differ;
- tok/s on vs off (medians of ``--rounds``), the acceptance rate (accepted / drafted, from the
  responses' ``usage.completion_tokens_details``), and whether the outputs were identical;
- llama-server (``.peers/llama.cpp``, ``bench/install_peers.sh``) on the same GGUF at batch 1,
  ``-np 1 -t 2``, plain decoding, and with its own n-gram lookup speculation where its build
  has one (said in the results either way).

It also measures what the draft-length policy models: one sequence's native step time at
``1 + k`` rows (a 512-token context) relative to one row, the ``row_cost`` c of
``agentlang.runtime.speculative.policy``.

    .venv/bin/python bench/speculative.py [--rounds 5] [--new-tokens 256] [--quick]
                                          # writes bench/results/speculative.json
    .venv/bin/python bench/speculative.py --shared-only --new-tokens 128
                                          # bench/results/speculative_shared.json

The rounds above run on a server without the index of other requests' outputs (they repeat
the same prompts, which it would copy); ``shared_side`` measures that index on its own: each
copy-heavy workload's 8 variants in turn, on a server without it and on one with it.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.output import write_results  # noqa: E402
from bench.peers import LLAMA_SERVER, launch, start_llama  # noqa: E402
from bench.serve import stop_server  # noqa: E402
from bench.speculative_prompts import COPY_HEAVY, WORKLOADS  # noqa: E402
from tests.support.cluster import free_port  # noqa: E402

BATCHES = (1, 8)


# ---- the policy's row cost ----------------------------------------------------------------
def row_costs(context: int = 512, rows=(1, 2, 3, 5, 9, 17), reps: int = 15) -> dict:
    """Native step time of one sequence appending ``k`` tokens after ``context`` cached ones,
    min of ``reps``; ``c(k) = (t(k) / t(1) - 1) / (k - 1)``."""
    from agentlang.runtime import Engine
    from agentlang.runtime.speculative.calibrate import step_seconds
    from agentlang.runtime.weights.model_loader import resolve_model

    eng = Engine(resolve_model("default", "auto").path, weights="auto", kv_budget_mb=64)
    pages = eng.allocator.allocate(-(-(context + max(rows)) // eng.pool.page_size))
    times = {k: step_seconds(eng.model, eng.pool, eng.backend, pages, context, k, reps)
             for k in rows}
    native = eng.model.native_decoder is not None
    eng.allocator.decref(pages)
    t1 = times[1]
    return {"native_decode_layer": native, "context": context,
            "step_ms": {k: round(t * 1e3, 3) for k, t in times.items()},
            "row_cost": {k: round((times[k] / t1 - 1) / (k - 1), 4) for k in rows if k > 1}}


# ---- the workloads ------------------------------------------------------------------------
def prompts_of(tok, name: str, batch: int) -> list[list[int]]:
    msgs = WORKLOADS[name]
    out = []
    for i in range(batch):
        m = [dict(x) for x in msgs]
        if batch > 1:
            m[0]["content"] = f"Request {i + 1} of {batch}.\n" + m[0]["content"]
        text = tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        out.append(tok.encode(text, add_special_tokens=False))
    return out


async def run_batch(c: httpx.AsyncClient, model: str, prompts, new_tokens: int,
                    extra: dict) -> dict:
    async def one(p):
        body = {"model": model, "prompt": p, "max_tokens": new_tokens, "temperature": 0,
                "ignore_eos": True, **extra}
        r = await c.post("/v1/completions", json=body)
        r.raise_for_status()
        return r.json()

    t0 = time.perf_counter()
    outs = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - t0
    tokens = sum(o["usage"]["completion_tokens"] for o in outs)
    details = [o["usage"].get("completion_tokens_details") or {} for o in outs]
    kept = sum(d.get("accepted_prediction_tokens", 0) for d in details)
    drafted = kept + sum(d.get("rejected_prediction_tokens", 0) for d in details)
    return {"tok_s": tokens / wall, "drafted": drafted, "accepted": kept,
            "texts": [o["choices"][0]["text"] for o in outs]}


def agentlang_side(args, tok) -> dict:
    port = free_port()
    # the same prompts every round: the index of other requests' outputs would copy the
    # previous round's answers, so these figures are the own context's (shared_side: the index)
    cmd = [sys.executable, "-m", "agentlang.runtime.server", "--port", str(port),
           "--weights", "auto", "--log-level", "warning", "--speculative-shared-cap", "0",
           *args.server_args]
    server = launch("agentlang", cmd, port, "default", cwd=ROOT)
    results: dict = {}
    try:
        async def main():
            async with httpx.AsyncClient(base_url=server.url, timeout=3600) as c:
                for name in args.workloads:
                    for batch in args.batches:
                        prompts = prompts_of(tok, name, batch)
                        await run_batch(c, server.model, prompts, 2, {})    # cache the prompts
                        rounds = {"off": [], "on": []}
                        last = {}
                        for _ in range(args.rounds):
                            for mode in ("off", "on"):
                                r = await run_batch(c, server.model, prompts, args.new_tokens,
                                                    {"speculative": mode == "on"})
                                rounds[mode].append(r)
                                last[mode] = r
                        off = statistics.median(r["tok_s"] for r in rounds["off"])
                        on = statistics.median(r["tok_s"] for r in rounds["on"])
                        drafted = sum(r["drafted"] for r in rounds["on"])
                        kept = sum(r["accepted"] for r in rounds["on"])
                        same = all(a["texts"] == b["texts"] for a, b in zip(rounds["off"],
                                                                              rounds["on"]))
                        row = {"off_tok_s": round(off, 2), "on_tok_s": round(on, 2),
                               "speedup": round(on / off, 3),
                               "acceptance": round(kept / drafted, 3) if drafted else None,
                               "accepted_per_request": kept / (args.rounds * batch),
                               "identical_outputs": same,
                               "off_rounds": [round(r["tok_s"], 2) for r in rounds["off"]],
                               "on_rounds": [round(r["tok_s"], 2) for r in rounds["on"]]}
                        results[f"{name}/batch{batch}"] = row
                        print(f"  {name:11s} batch {batch}: off {off:6.1f}  on {on:6.1f} tok/s "
                              f"x{on / off:.2f}  acceptance {row['acceptance']}  "
                              f"identical {same}", flush=True)
                metrics = (await c.get("/metrics")).text
                cost = re.search(r"^agentlang_speculative_row_cost (\S+)$", metrics, re.M)
                results["policy_row_cost"] = float(cost.group(1)) if cost else None
                print(f"  the draft policy's row cost: {results['policy_row_cost']}", flush=True)
        asyncio.run(main())
    finally:
        stop_server(server.proc)
    return results


def shared_side(args, tok) -> dict:
    """Drafts from other requests' outputs: each copy-heavy workload's 8 variants (their own
    first lines) one after another, speculation on, on a server without the shared index and on
    one with it (fresh servers; no prompt repeats): tok/s of the 8, acceptance, identity."""
    results: dict = {}
    for cap in ("0", "65536"):
        port = free_port()
        cmd = [sys.executable, "-m", "agentlang.runtime.server", "--port", str(port), "--weights",
               "auto", "--log-level", "warning", "--speculative-shared-cap", cap]
        server = launch("agentlang", cmd, port, "default", cwd=ROOT)
        try:
            async def main():
                async with httpx.AsyncClient(base_url=server.url, timeout=3600) as c:
                    for name in COPY_HEAVY:
                        runs = []
                        for p in prompts_of(tok, name, 8):
                            await run_batch(c, server.model, [p], 2, {})    # cache the prompt
                            runs.append(await run_batch(c, server.model, [p], args.new_tokens,
                                                        {"speculative": True}))
                        results.setdefault(name, {})[cap] = runs
            asyncio.run(main())
        finally:
            stop_server(server.proc)
    out = {}
    for name, by_cap in results.items():
        row = {}
        for cap, runs in by_cap.items():
            rate = statistics.median(r["tok_s"] for r in runs[1:])     # the 7 after the first
            drafted = sum(r["drafted"] for r in runs)
            row[f"cap{cap}"] = {"tok_s_median_after_first": round(rate, 2),
                                "acceptance": round(sum(r["accepted"] for r in runs) / drafted, 3)
                                if drafted else None,
                                "accepted": sum(r["accepted"] for r in runs)}
        row["speedup"] = round(row["cap65536"]["tok_s_median_after_first"] /
                               row["cap0"]["tok_s_median_after_first"], 3)
        row["identical_outputs"] = [r["texts"] for r in by_cap["0"]] == \
            [r["texts"] for r in by_cap["65536"]]
        out[name] = row
        print(f"  shared index {name:11s}: x{row['speedup']:.2f}  {row}", flush=True)
    return out


# llama-server's own model-free speculation, where its build has it (--spec-type): its
# defaults (12-token lookup, 48-token drafts) and a setting closer to agent turns' short copies
LLAMA_SPEC = {"ngram-simple": ("--spec-type", "ngram-simple"),
              "ngram-simple n3 m16": ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                                      "3", "--spec-ngram-simple-size-m", "16")}


def llama_side(args, tok, gguf: Path, extra: tuple[str, ...] = ()) -> dict:
    """llama-server at batch 1 on each workload (its /completion with token ids)."""
    help_text = subprocess.run([str(LLAMA_SERVER), "--help"], capture_output=True,
                               text=True).stdout
    lookup = [f for f in ("--spec-type", "--lookup-ngram-min", "--draft-max") if f in help_text]
    server = start_llama(gguf, args, extra)
    out: dict = {"lookup_flags_in_build": lookup, "flags": list(extra),
                 "note": "plain decoding" if not extra else "its n-gram speculation on"}
    try:
        with httpx.Client(base_url=server.url, timeout=3600) as c:
            for name in args.workloads:
                p = prompts_of(tok, name, 1)[0]
                body = {"prompt": p, "n_predict": args.new_tokens, "temperature": 0,
                        "ignore_eos": True, "cache_prompt": True}
                c.post("/completion", json={**body, "n_predict": 2}).raise_for_status()
                rates = []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    r = c.post("/completion", json=body)
                    r.raise_for_status()
                    rates.append(r.json()["tokens_predicted"] / (time.perf_counter() - t0))
                out[f"{name}/batch1"] = {"tok_s": round(statistics.median(rates), 2),
                                         "rounds": [round(x, 2) for x in rates]}
                print(f"  llama-server {name:11s}: {statistics.median(rates):6.1f} tok/s",
                      flush=True)
    finally:
        stop_server(server.proc)
    return out


def geomean(xs):
    xs = list(xs)
    return round(statistics.geometric_mean(xs), 3) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--no-llama", action="store_true", help="skip llama-server")
    ap.add_argument("--quick", action="store_true", help="2 rounds, 64 tokens (a smoke run)")
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCHES), choices=BATCHES)
    ap.add_argument("--no-shared", action="store_true", help="skip shared_side")
    ap.add_argument("--shared-only", action="store_true",
                    help="only the shared index of other requests' outputs (shared_side)")
    ap.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                    help="the rest of the line goes to agentlang serve (the policy's settings: "
                         "--speculative-max-draft N --speculative-row-cost C)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.new_tokens = 2, 64
    from transformers import AutoTokenizer

    from agentlang.runtime.weights.model_loader import resolve_model
    gguf = resolve_model("default", "auto").path
    tok = AutoTokenizer.from_pretrained(resolve_model("default", "dense").path)
    print("row cost of the native step ...", flush=True)
    results = {"machine": platform.processor() or platform.machine(),
               "cpus": __import__("os").cpu_count(),
               "settings": {"rounds": args.rounds, "new_tokens": args.new_tokens,
                            "model": "SmolLM2-135M-Instruct Q4_1 (weights auto, float32)",
                            "server_args": args.server_args},
               "row_cost": row_costs()}
    print(results["row_cost"], flush=True)
    if not args.no_shared:
        print("the shared index: 8 variants of each copy-heavy workload in turn ...", flush=True)
        results["shared_index"] = shared_side(args, tok)
    if args.shared_only:
        path = write_results("speculative_shared", results, args.out, args.quick)
        print(f"wrote {path}")
        return
    print("agentlang serve, speculation off / on ...", flush=True)
    results["agentlang"] = ag = agentlang_side(args, tok)
    for batch in args.batches:
        results[f"geomean_copy_heavy_batch{batch}"] = geomean(
            ag[f"{n}/batch{batch}"]["speedup"] for n in COPY_HEAVY if f"{n}/batch{batch}" in ag)
    if not args.no_llama and LLAMA_SERVER.exists():
        print("llama-server ...", flush=True)
        results["llama_server"] = ll = llama_side(args, tok, Path(gguf))
        results["vs_llama_batch1"] = {n: round(ag[f"{n}/batch1"]["on_tok_s"] /
                                               ll[f"{n}/batch1"]["tok_s"], 3)
                                      for n in args.workloads if f"{n}/batch1" in ll}
        if "--spec-type" in ll["lookup_flags_in_build"]:
            for label, flags in LLAMA_SPEC.items():
                print(f"llama-server with its speculation ({label}) ...", flush=True)
                sp = results[f"llama_server {label}"] = llama_side(args, tok, Path(gguf), flags)
                results[f"vs_llama {label} batch1"] = {
                    n: round(ag[f"{n}/batch1"]["on_tok_s"] / sp[f"{n}/batch1"]["tok_s"], 3)
                    for n in args.workloads if f"{n}/batch1" in sp}
    path = write_results("speculative", results, args.out, args.quick)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
