"""Agents that pause on tools: sessions (retention) on vs off (plain LRU) vs vLLM CPU.

Workload (seeded): ``--agents`` ReAct-style agents over HTTP (``POST /v1/chat/completions``,
greedy, ``ignore_eos``), started together. Every agent shares one system prompt of about 1.5k
tokens that describes the tools (their JSON definitions and the rules), has its own task of
about 100 tokens, and runs ``--turns`` turns: each turn generates exactly 40 tokens (the tool
call), then its tool "runs" for a seeded 0.5–4 s, then a 150-token observation is appended as
the next user message. The tools are described in the system prompt rather than sent as
``tools`` so that every server sees the same bytes and generates the same number of tokens.

Pool sizes: ½ and ¼ of the peak total history of all agents (the shared prompt once, plus each
agent's history at its last turn), in tokens: agentlang's ``--kv-budget-mb`` is that many
tokens of its KV; vLLM gets the same number of tokens as ``--kv-cache-memory-bytes`` (its CPU
worker's explicit KV size, in bf16; ``VLLM_CPU_KVCACHE_SPACE`` is left unset: it takes whole GiB
only).

Reported per run: job completion time (an agent's first request to its last answer; mean,
p99), prefill tokens computed (Σ prompt − cached over all requests, from each answer's
``usage.prompt_tokens_details.cached_tokens``), *recomputed* prefill (computed minus the
tokens no cache could have had: each turn's new tokens, the shared prompt once), and output
tok/s. ``on``: each agent sends ``session_id: agent-<i>`` and closes its session at the end
(``/close_session``); ``hints``: ``on`` plus a next-use hint after each answer, before its tool
runs (``POST /session_hint`` with the tool's duration, which this load generator knows exactly:
what a framework's duration estimates can do at best); ``off``: no session fields.

    python bench/agent_sessions.py [--quick] [--peers vllm]   # writes bench/results/agent_sessions.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.output import write_results  # noqa: E402
from bench.peers import VLLM_PY, launch  # noqa: E402
from bench.serve import stop_server  # noqa: E402
from agentlang.runtime.core.program_service import SCHEDULE_POLICIES  # noqa: E402
from tests.support.cluster import free_port  # noqa: E402

CALL_TOKENS, OBSERVATION_TOKENS, TASK_TOKENS, SYSTEM_TOKENS = 40, 150, 100, 1500
TOOLS = [
    {"name": "search", "description": "Search the web and return the top snippets.",
     "parameters": {"type": "object", "properties": {
         "query": {"type": "string"}, "k": {"type": "integer", "minimum": 1}},
         "required": ["query"]}},
    {"name": "read", "description": "Fetch a page and return its main text.",
     "parameters": {"type": "object", "properties": {"url": {"type": "string"}},
                    "required": ["url"]}},
    {"name": "calculate", "description": "Evaluate an arithmetic expression.",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                    "required": ["expression"]}},
    {"name": "write_note", "description": "Append a note to the agent's scratchpad.",
     "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                    "required": ["text"]}},
]
WORDS = ("river harbor ledger signal orbit copper meadow lantern quartz summit ember canyon "
         "archive beacon cipher delta falcon garnet horizon island jasper kernel lagoon marble "
         "nectar onyx prairie quiver raven saffron timber umber velvet willow zenith").split()


def text_of(tok, seed: str, n: int, rng: random.Random) -> str:
    """Seeded words trimmed to ``n`` tokens of ``tok``."""
    words = [rng.choice(WORDS) for _ in range(n * 2)]
    ids = tok.encode(seed + " " + " ".join(words), add_special_tokens=False)[:n]
    return tok.decode(ids)


def system_prompt(tok) -> str:
    rules = ("You are a research agent. Think step by step. Call exactly one tool per turn by "
             "writing its name and JSON arguments. Never invent observations. ")
    head = "Tools:\n" + "\n".join(json.dumps(t) for t in TOOLS) + "\nRules: "
    text, k = head, 0
    while len(tok.encode(text, add_special_tokens=False)) < SYSTEM_TOKENS:
        k += 1
        text += f"({k}) " + rules
    return tok.decode(tok.encode(text, add_special_tokens=False)[:SYSTEM_TOKENS])


def plan(tok, agents: int, turns: int, seed: int) -> dict:
    rng = random.Random(seed)
    return {"system": system_prompt(tok),
            "tasks": [text_of(tok, f"Task {i}:", TASK_TOKENS, rng) for i in range(agents)],
            "observations": [[text_of(tok, "Observation:", OBSERVATION_TOKENS, rng)
                              for _ in range(turns)] for _ in range(agents)],
            "sleeps": [[rng.uniform(0.5, 4.0) for _ in range(turns)] for _ in range(agents)]}


def peak_history_tokens(tok, p: dict, turns: int) -> int:
    per_agent = [len(tok.encode(t, add_special_tokens=False)) + turns * CALL_TOKENS
                 + (turns - 1) * OBSERVATION_TOKENS for t in p["tasks"]]
    return SYSTEM_TOKENS + sum(per_agent)


TRACED = ("agentlang_live_programs", "agentlang_live_program_limit",
          "agentlang_num_requests_running", "agentlang_num_requests_waiting")


async def trace_server(c: httpx.AsyncClient, t0: float, every_s: float = 2.0) -> list[dict]:
    """agentlang's ``/metrics`` every ``every_s`` until cancelled: the live programs, their
    limit, running and waiting requests, and the hold releases by reason (cumulative)."""
    samples: list[dict] = []
    try:
        while True:
            text = (await c.get("/metrics")).text
            row: dict = {"t": round(time.perf_counter() - t0, 1)}
            for line in text.splitlines():
                name, _, value = line.rpartition(" ")
                if name in TRACED:
                    row[name[len("agentlang_"):]] = float(value)
                elif name.startswith("agentlang_session_hold_releases_total{reason="):
                    row["released_" + name.split('"')[1]] = float(value)
            samples.append(row)
            await asyncio.sleep(every_s)
    except asyncio.CancelledError:
        return samples


async def run_agents(url: str, model: str, p: dict, turns: int, sessions: bool,
                     hints: bool = False, trace: bool = False) -> dict:
    limits = httpx.Limits(max_connections=len(p["tasks"]) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as c:
        async def agent(i: int) -> dict:
            messages = [{"role": "system", "content": p["system"]},
                        {"role": "user", "content": p["tasks"][i]}]
            t0, prompts, cached, out = time.perf_counter(), [], [], 0
            for k in range(turns):
                body = {"model": model, "messages": messages, "max_tokens": CALL_TOKENS,
                        "temperature": 0, "ignore_eos": True}
                if sessions:
                    body["session_id"] = f"agent-{i}"
                r = await c.post("/v1/chat/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"agent {i} turn {k}: HTTP {r.status_code}: {r.text[:400]}")
                res = r.json()
                u = res["usage"]
                prompts.append(u["prompt_tokens"])
                cached.append((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                out += u["completion_tokens"]
                if k == turns - 1:
                    break
                messages += [{"role": "assistant",
                              "content": res["choices"][0]["message"]["content"] or ""},
                             {"role": "user", "content": p["observations"][i][k]}]
                if hints:
                    await c.post("/session_hint", json={"session_id": f"agent-{i}",
                                                        "next_use_s": p["sleeps"][i][k]})
                await asyncio.sleep(p["sleeps"][i][k])
            done = time.perf_counter()
            if sessions:
                await c.post("/close_session", json={"session_id": f"agent-{i}"})
            return {"jct": done - t0, "prompts": prompts, "cached": cached, "out": out}

        t0 = time.perf_counter()
        tracer = asyncio.create_task(trace_server(c, t0)) if trace else None
        agents = await asyncio.gather(*[agent(i) for i in range(len(p["tasks"]))])
        wall = time.perf_counter() - t0
        samples = None
        if tracer is not None:
            tracer.cancel()
            samples = await tracer
    out = summarize(agents, wall)
    if samples is not None:
        out["server_trace"] = samples      # /metrics every 2 s (``trace_server``)
    return out


def summarize(agents: list[dict], wall: float) -> dict:
    jcts = sorted(a["jct"] for a in agents)
    computed = sum(pt - ct for a in agents for pt, ct in zip(a["prompts"], a["cached"]))
    # tokens no cache could hold: the shared prompt once, each agent's first-turn rest, and
    # each later turn's growth (previous answer + observation)
    fresh = SYSTEM_TOKENS
    for a in agents:
        fresh += a["prompts"][0] - SYSTEM_TOKENS
        fresh += sum(b - prev for prev, b in zip(a["prompts"], a["prompts"][1:]))
    out = sum(a["out"] for a in agents)
    return {"jct_mean_s": statistics.mean(jcts),
            "jct_p99_s": jcts[min(len(jcts) - 1, math.ceil(0.99 * len(jcts)) - 1)],
            "prefill_computed_tokens": computed,
            "prefill_recomputed_tokens": max(0, computed - fresh),
            "output_tok_s": out / wall, "wall_s": wall, "output_tokens": out,
            "per_agent": [{"prompts": a["prompts"], "cached": a["cached"]} for a in agents]}


def start_agentlang(tokens: int, args, policy: str = "lpm") -> object:
    wide = args.dtype == "float32" and args.kv_dtype == "auto"
    bytes_per_token = 2 * 3 * 64 * 30 * (4 if wide else 2)                     # SmolLM2-135M
    mb = tokens * bytes_per_token / 2**20
    port = free_port()
    cmd = [sys.executable, "-m", "agentlang.runtime.server", "--port", str(port),
           "--dtype", args.dtype, "--weights", args.weights, "--kv-budget-mb", f"{mb:.3f}",
           "--max-batch-tokens", "2048", "--max-running", "64", "--log-level", "warning",
           "--session-max-fraction", str(args.session_max_fraction),
           "--schedule-policy", policy, "--kv-dtype", args.kv_dtype]
    if args.row_cost is not None:
        cmd += ["--speculative-row-cost", str(args.row_cost)]
    return launch(f"agentlang ({args.dtype}, {args.weights})", cmd, port, "default", cwd=ROOT)


def start_vllm(tokens: int, args) -> tuple[object, int]:
    from agentlang.runtime.weights.model_loader import resolve_model

    width = 4 if args.vllm_dtype == "float32" else 2
    kv_bytes = tokens * 2 * 3 * 64 * 30 * width        # K and V of SmolLM2-135M
    port = free_port()
    cmd = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(resolve_model("default", "dense").path), "--served-model-name", "default",
           "--host", "127.0.0.1", "--port", str(port), "--dtype", args.vllm_dtype,
           "--enable-prefix-caching", "--enable-prompt-tokens-details", "--max-num-seqs", "64",
           "--max-num-batched-tokens", "2048", "--max-model-len", "4096",
           "--kv-cache-memory-bytes", str(kv_bytes)]
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    return launch("vLLM CPU", cmd, port, "default", env), kv_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fractions", type=float, nargs="*", default=[0.5, 0.25])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--kv-dtype", default="auto", choices=["auto", "bfloat16"],
                    help="agentlang's KV storage (bfloat16: a float32 model's K/V in bf16; the "
                    "pool keeps the same number of tokens)")
    ap.add_argument("--weights", default="auto", choices=["auto", "dense", "int8"],
                    help="agentlang's weights (int8: W8A8, a lower precision than vLLM's bf16)")
    ap.add_argument("--peers", nargs="*", default=[], choices=["vllm"])
    ap.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="vLLM's dtype (bfloat16: the issue's setting; float32 on CPUs without "
                         "bf16 instructions, where vLLM's bf16 is emulated)")
    ap.add_argument("--session-max-fraction", type=float, default=0.8)
    ap.add_argument("--row-cost", type=float, default=None,
                    help="agentlang's --speculative-row-cost (also the live policy's busy bound; "
                         "default: the server's)")
    ap.add_argument("--modes", nargs="*", default=["off", "on"], choices=["off", "on", "hints"],
                    help="agentlang runs (none: the peers only)")
    ap.add_argument("--quick", action="store_true", help="8 agents, 3 turns, pool 1/2")
    ap.add_argument("--schedule-policies", nargs="+", default=["lpm"],
                    choices=SCHEDULE_POLICIES,
                    help="agentlang's --schedule-policy, each its own run (program: Autellix's "
                         "least-served program first; results keyed '... (program)')")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.quick:
        args.agents, args.turns, args.fractions = 8, 3, [0.5]
    if "vllm" in args.peers and not VLLM_PY.exists():
        sys.exit(f"missing {VLLM_PY}: run bench/install_peers.sh first")
    from transformers import AutoTokenizer

    from agentlang.runtime.weights.model_loader import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("default", "dense").path)
    p = plan(tok, args.agents, args.turns, args.seed)
    peak = peak_history_tokens(tok, p, args.turns)
    print(f"{args.agents} agents x {args.turns} turns, peak total history {peak} tokens",
          flush=True)
    res: dict = {}
    for frac in args.fractions:
        tokens = int(peak * frac)
        row = res[f"pool {frac:g}"] = {"pool_tokens": tokens}
        for policy in args.schedule_policies:
            for mode in args.modes:
                label = f"sessions {mode}" + ("" if policy == "lpm" else f" ({policy})")
                server = start_agentlang(tokens, args, policy)
                try:
                    row[f"agentlang {label}"] = r = asyncio.run(
                        run_agents(server.url, server.model, p, args.turns, mode != "off",
                                   mode == "hints", trace=True))
                finally:
                    stop_server(server.proc)
                _print(f"pool {frac:g} agentlang {label}", r)
        if "vllm" in args.peers:
            server, kv_bytes = start_vllm(tokens, args)
            try:
                row["vllm"] = r = asyncio.run(run_agents(server.url, server.model, p,
                                                         args.turns, False))
                row["vllm_kv_bytes"] = kv_bytes
            finally:
                stop_server(server.proc)
            _print(f"pool {frac:g} vLLM", r)
        on, off = row.get("agentlang sessions on"), row.get("agentlang sessions off")
        for mode in ("on", "hints"):
            this = row.get(f"agentlang sessions {mode}")
            if this and off:
                row[f"{mode}_vs_off"] = {
                    "recomputed_share": this["prefill_recomputed_tokens"]
                    / max(1, off["prefill_recomputed_tokens"]),
                    "jct_mean_speedup": off["jct_mean_s"] / this["jct_mean_s"]}
                print(f"  pool {frac:g}: {mode}/off {row[f'{mode}_vs_off']}", flush=True)
        if on and "vllm" in row:
            row["on_vs_vllm_jct_mean_speedup"] = row["vllm"]["jct_mean_s"] / on["jct_mean_s"]
    result = {"machine": f"{os.cpu_count()}-core {platform.machine()}, one server at a time",
              "model": f"SmolLM2-135M-Instruct (Q4_1 GGUF, weights {args.weights})",
              "command": "python bench/agent_sessions.py " + " ".join(sys.argv[1:]),
              "settings": {"dtype": args.dtype, "row_cost": args.row_cost,
                           "session_max_fraction": args.session_max_fraction},
              "workload": {"agents": args.agents, "turns": args.turns, "seed": args.seed,
                           "peak_history_tokens": peak},
              "results": res}
    print("wrote", write_results("agent_sessions", result, args.out, args.quick))


def _print(name: str, r: dict) -> None:
    print(f"  {name}: JCT mean {r['jct_mean_s']:.1f} s p99 {r['jct_p99_s']:.1f} s, prefill "
          f"computed {r['prefill_computed_tokens']} recomputed {r['prefill_recomputed_tokens']}"
          f", {r['output_tok_s']:.1f} out tok/s", flush=True)
    trace = r.get("server_trace") or []
    if trace:
        last = trace[-1]
        released = {k[len("released_"):]: int(v) for k, v in last.items()
                    if k.startswith("released_") and v}
        limits = [int(s["live_program_limit"]) for s in trace if "live_program_limit" in s]
        path = [v for i, v in enumerate(limits) if i == 0 or v != limits[i - 1]]
        print(f"    holds released {released}; live limit over time {path[:40]}", flush=True)


if __name__ == "__main__":
    main()
