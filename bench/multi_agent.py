"""Many agents on one server: an interactive agent's time to first token while a background
agent keeps the server busy, with priorities off, on, and on an idle server.

- interactive agent: one short chat turn (``POST /v1/chat/completions``, streaming, a short
  user question, ``--chat-tokens`` new tokens) every ``--period`` seconds for ``--duration``
  seconds; TTFT = request sent → first SSE chunk with content (a turn with none within
  ``--turn-timeout`` counts as that, reported as censored). Label ``agent: interactive``.
- background agent: ``--background`` closed-loop clients on ``POST /generate``, each sending
  its next long request (``--bg-prompt-tokens`` prompt, ``--bg-new-tokens`` ± ``--bg-spread``
  new, seeded) as soon as the previous one finished, so that many are always queued or
  running. Label ``agent: background``.

Runs, each on a fresh ``python -m agentlang.runtime.server`` process with the same settings:
``idle`` (interactive agent alone), ``off`` (both agents, no priorities), ``on`` (both,
interactive ``priority`` = ``--high``, background ``priority`` = 0). Background throughput =
tokens generated on the server (``/metrics`` ``agentlang_generation_tokens_total``, counted
per step) over a fixed window of ``--duration`` seconds from the first interactive turn, less
the interactive turns finished in it, per second (the same window in every run, however long
the last turns take); "lost" = 1 - on / off. The same per CPU second of the server process
(``/proc``) as well: on a shared machine the wall-clock rate follows the other processes' load,
the rate per CPU second much less. Greedy, ``ignore_eos``.

    python bench/multi_agent.py [--duration 60] [--period 2] [--background 128] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.serve import _scrape, percentile, sse_events, start_server, stop_server  # noqa: E402,E501
from bench.workloads import text_of_tokens  # noqa: E402

QUESTIONS = ("What is the capital of France?", "Name a prime number above ten.",
             "Say hello in Spanish.", "What colour is the sky?", "How many legs has a cat?")


async def interactive(c: httpx.AsyncClient, args, priority: int | None) -> dict:
    """One chat turn every ``period`` s; returns TTFTs and (finish time, tokens) per turn."""
    ttfts: list[float] = []
    done: list[tuple[float, int]] = []      # (time the usage arrived, tokens) per turn
    censored = [0]          # turns with no first token within turn_timeout (counted as it)

    async def turn(k: int) -> None:
        body = {"model": "default", "stream": True, "max_tokens": args.chat_tokens,
                "temperature": 0, "ignore_eos": True, "agent": "interactive",
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": QUESTIONS[k % len(QUESTIONS)]}]}
        if priority is not None:
            body["priority"] = priority
        t0, first = time.perf_counter(), None

        async def read() -> None:
            nonlocal first
            async for event in sse_events(c, "/v1/chat/completions", body):
                if first is None and any(ch["delta"].get("content") for ch in event["choices"]):
                    first = time.perf_counter() - t0
                if event.get("usage"):
                    done.append((time.perf_counter(), event["usage"]["completion_tokens"]))

        try:
            await asyncio.wait_for(read(), args.turn_timeout)
        except asyncio.TimeoutError:
            censored[0] += first is None
        ttfts.append(first if first is not None else args.turn_timeout)

    turns = []
    for k in range(int(args.duration / args.period)):
        turns.append(asyncio.create_task(turn(k)))
        await asyncio.sleep(args.period)
    await asyncio.gather(*turns)
    return {"ttfts": ttfts, "done": done, "censored": censored[0]}


def bg_new_tokens(args, k: int) -> int:
    """New tokens of the background agent's ``k``-th request: ``--bg-new-tokens`` ± the
    spread, seeded by ``k`` (the same sequence in every run), so that the 128 clients do not
    finish in lockstep waves (a wave's prefill makes the steps of a whole window long)."""
    half = int(args.bg_new_tokens * args.bg_spread)
    return args.bg_new_tokens + random.Random(k).randint(-half, half)


async def background(c: httpx.AsyncClient, args, prompts: list[list[int]], priority: int | None,
                     stop: asyncio.Event) -> None:
    async def client(i: int) -> None:
        k = i
        while not stop.is_set():
            body = {"input_ids": prompts[k % len(prompts)], "agent": "background",
                    "sampling_params": {"max_new_tokens": bg_new_tokens(args, k),
                                        "temperature": 0, "ignore_eos": True}}
            if priority is not None:
                body["priority"] = priority
            try:
                (await c.post("/generate", json=body)).raise_for_status()
            except httpx.HTTPError:
                if not stop.is_set():
                    raise
            k += args.background

    await asyncio.gather(*[client(i) for i in range(args.background)])


def run_mode(mode: str, args, prompts: list[list[int]], engine_kwargs: dict) -> dict:
    log = Path(tempfile.mkstemp(prefix=f"bench-multi-agent-{mode}-", suffix=".log")[1])
    proc, url = start_server(engine_kwargs, log)

    async def main() -> dict:
        # Two clients: the background's connections never hold up an interactive turn.
        limits = httpx.Limits(max_connections=args.background + 4)
        async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as bc, \
                httpx.AsyncClient(base_url=url, timeout=3600,
                                  limits=httpx.Limits(max_connections=None)) as c:
            warm = argparse.Namespace(**{**vars(args), "duration": 1, "period": 1})
            await interactive(c, warm, None)                           # warm-up
            (await c.post("/flush_cache")).raise_for_status()
            stop = asyncio.Event()
            bg = None
            if mode != "idle":
                bg = asyncio.create_task(background(bc, args, prompts,
                                                    0 if mode == "on" else None, stop))
                await asyncio.sleep(args.ramp)                          # the queue fills up
            m0 = await _scrape(c)
            t0, cpu0, load0 = time.perf_counter(), _cpu_s(proc.pid), os.getloadavg()[0]

            async def window_end() -> tuple[dict, float, float]:
                await asyncio.sleep(args.duration)
                m = await _scrape(c)                    # waits for the step in flight
                return m, time.perf_counter(), _cpu_s(proc.pid)

            end = asyncio.create_task(window_end())
            chat = await interactive(c, args, args.high if mode == "on" else None)
            (mw, t1, cpu1), load1 = await end, os.getloadavg()[0]
            m1, full = await _scrape(c), await _scrape_labeled(c)
            stop.set()
            if bg is not None:
                bg.cancel()
        key = "agentlang_generation_tokens_total"
        bg_tokens = mw[key] - m0[key] - sum(n for t, n in chat["done"] if t <= t1)
        ttfts = chat["ttfts"]
        return {"turns": len(ttfts), "censored_turns": chat["censored"],
                "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99), "ttft_max_s": max(ttfts),
                "ttfts_sorted_s": [round(t, 3) for t in sorted(ttfts)],
                "window_s": t1 - t0, "background_tokens_per_s": bg_tokens / (t1 - t0),
                "server_cpu_s": cpu1 - cpu0,
                "background_tokens_per_cpu_s": bg_tokens / max(cpu1 - cpu0, 1e-9),
                "preemptions": m1["agentlang_preemptions_total"] -
                m0["agentlang_preemptions_total"],
                "layer_break_steps": m1["agentlang_layer_break_steps_total"] -
                m0["agentlang_layer_break_steps_total"], "per_agent": full,
                "load_average_1min": [round(load0, 2), round(load1, 2)]}

    try:
        return asyncio.run(main())
    finally:
        stop_server(proc)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the server process has used (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _scrape_labeled(c: httpx.AsyncClient) -> dict[str, dict[str, float]]:
    """``{agent: {metric: value}}`` of the per-agent series."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for f in text_string_to_metric_families((await c.get("/metrics")).text):
        for s in f.samples:
            if f.name.startswith("agentlang_agent_") and "agent" in s.labels:
                out.setdefault(s.labels["agent"], {})[s.name] = s.value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--period", type=float, default=2.0)
    ap.add_argument("--chat-tokens", type=int, default=8)
    ap.add_argument("--turn-timeout", type=float, default=120.0,
                    help="a turn with no first token by then counts as this TTFT (censored)")
    ap.add_argument("--background", type=int, default=128)
    ap.add_argument("--bg-prompt-tokens", type=int, default=128)
    ap.add_argument("--bg-new-tokens", type=int, default=128)
    ap.add_argument("--bg-spread", type=float, default=0.5,
                    help="background new tokens vary uniformly by this fraction (0: all equal)")
    ap.add_argument("--high", type=int, default=10, help="the interactive priority when on")
    ap.add_argument("--ramp", type=float, default=10.0, help="background head start (s)")
    ap.add_argument("--kv-budget-mb", type=float, default=1024)
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--max-batch-tokens", type=int, default=None,
                    help="tokens per engine step, all runs (default: the engine's 2048); on a "
                         "CPU a step's time grows with it, and a new turn waits for the step "
                         "in flight")
    ap.add_argument("--max-lower-priority-tokens", type=int, default=None,
                    help="lower-priority tokens in a step that serves a higher-priority "
                         "prefill (default: the engine's)")
    ap.add_argument("--modes", default="idle,off,on")
    ap.add_argument("--quick", action="store_true",
                    help="20 s, 24 background clients of 64+32 tokens, 8 running, 4 s ramp")
    ap.add_argument("--out", default=str(ROOT / "bench/results/multi_agent.json"))
    args = ap.parse_args()
    if args.quick:
        args.duration, args.background, args.ramp, args.max_running = 20.0, 24, 4.0, 8
        args.bg_prompt_tokens, args.bg_new_tokens = 64, 32
    from transformers import AutoTokenizer

    from agentlang.runtime.weights.model_loader import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model().path)
    rng = random.Random(0)
    prompts = [text_of_tokens(tok, args.bg_prompt_tokens, rng) for _ in range(args.background)]
    engine_kwargs = {"kv_budget_mb": args.kv_budget_mb, "max_running": args.max_running}
    for k in ("max_batch_tokens", "max_lower_priority_tokens"):
        if getattr(args, k) is not None:
            engine_kwargs[k] = getattr(args, k)
    runs = {}
    for mode in args.modes.split(","):
        runs[mode] = run_mode(mode, args, prompts, engine_kwargs)
        r = runs[mode]
        print(f"{mode:>4}: interactive TTFT p50 {r['ttft_p50_s']:.3f} s p99 "
              f"{r['ttft_p99_s']:.3f} s ({r['turns']} turns, {r['censored_turns']} censored); "
              f"background "
              f"{r['background_tokens_per_s']:.1f} tok/s; {r['preemptions']:.0f} preemptions; "
              f"{r['layer_break_steps']:.0f} layer breaks; "
              f"load {r['load_average_1min']}; "
              f"{r['background_tokens_per_cpu_s']:.2f} background tok per server CPU s",
              flush=True)
    result = {"machine": "2-core x86_64 CPU (shared)", "model": "SmolLM2-135M-Instruct (float32)",
              "command": "python bench/multi_agent.py " + " ".join(sys.argv[1:]),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "modes")},
              "engine": engine_kwargs, "runs": runs}
    if {"idle", "on"} <= set(runs):
        result["on_p99_over_idle_p99"] = runs["on"]["ttft_p99_s"] / runs["idle"]["ttft_p99_s"]
    if {"off", "on"} <= set(runs):
        for k, per in (("", "background_tokens_per_s"),
                       ("_per_cpu_s", "background_tokens_per_cpu_s")):
            result["background_throughput_lost" + k] = 1 - runs["on"][per] / runs["off"][per]
    for k in ("on_p99_over_idle_p99", "background_throughput_lost",
              "background_throughput_lost_per_cpu_s"):
        if k in result:
            print(f"{k}: {result[k]:.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
