"""HTTP serving overhead: the shared-prefix chat workload through the server vs in-process.

Workload (bench.workloads.shared_prefix_chat, greedy, ignore_eos): N requests = one shared
~1024-token system prompt + a unique ~32-token question each, 32 new tokens each, issued by C
concurrent clients (each client sends its next request when the previous one finished).

- in-process: one Engine, C concurrent ``engine.async_stream`` consumers in this process;
- HTTP: ``python -m agentlang.runtime.server`` with the same engine settings in a subprocess, C concurrent
  streaming clients (httpx) on ``POST /v1/completions`` with the prompt as token ids (so both
  runs compute exactly the same tokens).

Both start from a flushed prefix cache after a warm-up request. TTFT is measured by the caller
(submission → first streamed token / first SSE chunk with text); output tokens/s = all output
tokens / wall time of the run.

    python bench/serve.py [--requests 64] [--concurrency 16] [--system-tokens 1024]
                          [--question-tokens 32] [--new-tokens 32] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.output import write_results  # noqa: E402
from bench.workloads import Item, shared_prefix_chat  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


def summarize(ttfts: list[float], tokens: int, wall: float) -> dict:
    return {"wall_s": wall, "output_tokens": tokens, "tokens_per_s": tokens / wall,
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
            "ttft_mean_s": sum(ttfts) / len(ttfts),
            "ttfts_sorted_s": [round(t, 3) for t in sorted(ttfts)]}


async def _drive(items: list[Item], concurrency: int, one) -> tuple[list[float], int, float]:
    """Run ``one(item) -> (ttft, tokens)`` over ``items`` with ``concurrency`` workers."""
    queue: asyncio.Queue[Item] = asyncio.Queue()
    for it in items:
        queue.put_nowait(it)
    ttfts: list[float] = []
    tokens = [0]

    async def worker() -> None:
        while not queue.empty():
            ttft, n = await one(queue.get_nowait())
            ttfts.append(ttft)
            tokens[0] += n

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return ttfts, tokens[0], time.perf_counter() - t0


def run_inprocess(items: list[Item], concurrency: int, engine_kwargs: dict) -> dict:
    from agentlang.runtime import Engine, SamplingParams

    engine = Engine("default", **engine_kwargs)

    async def one(it: Item) -> tuple[float, int]:
        params = SamplingParams(max_tokens=it.max_new_tokens, temperature=0, ignore_eos=True)
        t0 = time.perf_counter()
        first, n = None, 0
        async for d in engine.async_stream(it.prompt_ids, params):
            if first is None and d.token_ids:
                first = time.perf_counter() - t0
            n += len(d.token_ids)
        return first, n

    async def main() -> dict:
        await one(Item(items[0].prompt_ids[:16], 2))          # warm-up
        await asyncio.to_thread(engine.flush_cache)
        m0 = engine.metrics()
        ttfts, tokens, wall = await _drive(items, concurrency, one)
        m1 = engine.metrics()
        out = summarize(ttfts, tokens, wall)
        q = m1["prefix_cache_queried_tokens"] - m0["prefix_cache_queried_tokens"]
        h = m1["prefix_cache_hit_tokens"] - m0["prefix_cache_hit_tokens"]
        out["prefix_hit_rate"] = h / q if q else 0.0
        return out

    try:
        return asyncio.run(main())
    finally:
        engine.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(engine_kwargs: dict, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "agentlang.runtime.server", "--port", str(port), "--log-level", "warning"]
    for k, v in engine_kwargs.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log_path.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not start")


def run_http(items: list[Item], concurrency: int, engine_kwargs: dict, log_path: Path) -> dict:
    proc, url = start_server(engine_kwargs, log_path)

    async def main() -> dict:
        limits = httpx.Limits(max_connections=concurrency + 4)
        async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as c:
            async def one(it: Item) -> tuple[float, int]:
                body = {"model": "default", "prompt": it.prompt_ids, "stream": True,
                        "max_tokens": it.max_new_tokens, "temperature": 0, "ignore_eos": True,
                        "stream_options": {"include_usage": True}}
                t0 = time.perf_counter()
                first, n = None, 0
                async for event in sse_events(c, "/v1/completions", body):
                    if first is None and any(ch["text"] for ch in event["choices"]):
                        first = time.perf_counter() - t0
                    if event.get("usage"):
                        n = event["usage"]["completion_tokens"]
                return first, n

            await one(Item(items[0].prompt_ids[:16], 2))      # warm-up
            (await c.post("/flush_cache")).raise_for_status()
            m0 = await _scrape(c)
            ttfts, tokens, wall = await _drive(items, concurrency, one)
            m1 = await _scrape(c)
        out = summarize(ttfts, tokens, wall)
        q = m1["agentlang_prefix_cache_queried_tokens_total"] - \
            m0["agentlang_prefix_cache_queried_tokens_total"]
        h = m1["agentlang_prefix_cache_hit_tokens_total"] - \
            m0["agentlang_prefix_cache_hit_tokens_total"]
        out["prefix_hit_rate"] = h / q if q else 0.0
        return out

    try:
        return asyncio.run(main())
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen) -> None:
    """Ctrl-C the server; kill it if it has not exited within 30 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


async def sse_events(c: httpx.AsyncClient, path: str, body: dict):
    """The JSON events of a streaming POST (until ``[DONE]``); an error event raises."""
    async with c.stream("POST", path, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"])
            yield event


async def _scrape(c: httpx.AsyncClient) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = (await c.get("/metrics")).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if not s.labels}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1024)
    ap.add_argument("--question-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--kv-budget-mb", type=float, default=256)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    ap.add_argument("--quick", action="store_true",
                    help="16 requests, 256-token system prompt, 8 new tokens, 8 clients")
    ap.add_argument("--out", help="JSON output (default: bench/results/serve.json; "
                    "a --quick run: a temporary directory)")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.system_tokens, args.new_tokens, args.concurrency = 16, 256, 8, 8
    from transformers import AutoTokenizer

    from agentlang.runtime.weights.model_loader import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model().path)
    items = shared_prefix_chat(tok, args.requests, args.system_tokens, args.question_tokens,
                               args.new_tokens)
    engine_kwargs = {"page_size": args.page_size, "kv_budget_mb": args.kv_budget_mb,
                     "max_batch_tokens": args.max_batch_tokens}
    print(f"{len(items)} requests x ({args.system_tokens} shared + {args.question_tokens} "
          f"unique prompt tokens, {args.new_tokens} new), {args.concurrency} clients", flush=True)
    inproc = run_inprocess(items, args.concurrency, engine_kwargs)
    _print("in-process", inproc)
    log = Path(tempfile.mkstemp(prefix="bench-serve-", suffix=".log")[1])
    http = run_http(items, args.concurrency, engine_kwargs, log)
    _print("HTTP", http)
    result = {
        "machine": "2-core x86_64 CPU, 24 GiB", "model": "SmolLM2-135M-Instruct (float32)",
        "torch_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "workload": {"name": "shared_prefix_chat", "requests": len(items),
                     "system_tokens": args.system_tokens,
                     "question_tokens": args.question_tokens, "new_tokens": args.new_tokens,
                     "concurrency": args.concurrency, "greedy": True, "ignore_eos": True},
        "engine": engine_kwargs,
        "command": "python bench/serve.py " + " ".join(sys.argv[1:]),
        "in_process": inproc, "http": http,
        "http_vs_in_process": {
            "throughput_ratio": http["tokens_per_s"] / inproc["tokens_per_s"],
            "ttft_p50_delta_s": http["ttft_p50_s"] - inproc["ttft_p50_s"],
            "ttft_p99_delta_s": http["ttft_p99_s"] - inproc["ttft_p99_s"]},
    }
    out = write_results("serve", result, args.out, args.quick)
    r = result["http_vs_in_process"]
    print(f"HTTP / in-process throughput {r['throughput_ratio']:.3f}; TTFT p50 "
          f"{r['ttft_p50_delta_s']:+.3f} s, p99 {r['ttft_p99_delta_s']:+.3f} s; wrote {out}")


def _print(name: str, r: dict) -> None:
    print(f"  {name:10s} {r['tokens_per_s']:7.1f} output tok/s  wall {r['wall_s']:6.1f} s  "
          f"TTFT p50 {r['ttft_p50_s']:.2f} s  p99 {r['ttft_p99_s']:.2f} s  "
          f"hit rate {r['prefix_hit_rate']:.2f}", flush=True)


if __name__ == "__main__":
    main()
