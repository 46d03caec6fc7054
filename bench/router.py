"""Scale-out behind sglang-router: cache-aware vs round-robin routing, then a replica killed
under load.

N ``agentlang serve`` replicas and the router run as real processes on free loopback ports
(:mod:`tests.support.cluster`). Workload: T tenants x R requests, each tenant its own ~S-token system
prompt and a short unique question per request, interleaved in a seeded random order (each
round visits every tenant once, in a new order), C concurrent clients on
``POST /v1/chat/completions`` (greedy, ``max_tokens`` new tokens).

1. For each ``--policy`` (default: cache_aware, then round_robin) the replicas' prefix caches
   are flushed, the router restarted with that policy, and the workload run. Reported: the
   prefix-cache hit rate over all replicas (hit tokens / looked-up prompt tokens, from each
   replica's ``/metrics`` before and after), requests/s, output tokens/s, mean latency, and how
   the requests spread over the replicas.
2. Kill: the router (cache_aware) with fast health checks; the workload again, and after
   ``--kill-after`` completions one replica is SIGKILLed. Every request must end within the
   client timeout, with a 200 or a clear HTTP error; afterwards ``--after`` more requests must
   all succeed through the survivor.

On 2 shared CPU cores this is a test of routing, not of speed.

    python bench/router.py [--replicas 2] [--tenants 8] [--requests 16] [--system-tokens 1000]
                           [--concurrency 8] [--max-tokens 8] [--kv-budget-mb 240] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.cluster import Cluster, start_cluster  # noqa: E402

WORDS = ("policy ledger invoice tenant account refund shipment carrier warehouse customer "
         "contract renewal discount region quota audit compliance billing support escalation "
         "priority storage network latency backup archive report forecast budget payroll").split()
MODEL = "SmolLM2-135M-Instruct"
FAST_FAILURE = ("--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                "--health-check-timeout-secs", "2", "--cb-failure-threshold", "2")


@dataclass
class Outcome:
    tenant: int
    status: str          # "ok", "http <code>: <message>", "error: <exception>"
    latency_s: float
    output_tokens: int = 0


def system_prompt(tenant: int, tokens: int) -> str:
    rng = random.Random(1000 + tenant)
    words = [rng.choice(WORDS) for _ in range(tokens)]        # ~1 token per word
    return f"You are the assistant of tenant {tenant}. Rules: " + " ".join(words) + "."


def workload(tenants: int, per_tenant: int, system_tokens: int, seed: int = 0) -> list[tuple]:
    """``(tenant, messages)`` in interleaved order: each round visits every tenant once."""
    rng = random.Random(seed)
    systems = [system_prompt(t, system_tokens) for t in range(tenants)]
    items = []
    for k in range(per_tenant):
        order = list(range(tenants))
        rng.shuffle(order)
        for t in order:
            items.append((t, [{"role": "system", "content": systems[t]},
                              {"role": "user", "content": f"Question {k}: summarise rule {k}."}]))
    return items


async def _one(http: httpx.AsyncClient, tenant: int, messages, max_tokens: int) -> Outcome:
    t0 = time.perf_counter()
    # "model" as OpenAI clients send it (the router forwards a request without one with
    # model "unknown", which the replica refuses)
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    try:
        r = await http.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as e:
        return Outcome(tenant, f"error: {type(e).__name__}: {e}", time.perf_counter() - t0)
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        return Outcome(tenant, f"http {r.status_code}: {r.text[:160]}", dt)
    return Outcome(tenant, "ok", dt, r.json()["usage"]["completion_tokens"])


async def run_load(url: str, items: list[tuple], concurrency: int, max_tokens: int,
                   timeout_s: float, on_done=None) -> list[Outcome]:
    """Run ``items`` with ``concurrency`` clients; ``on_done(n_finished)`` after each."""
    queue = list(reversed(items))
    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as http:
        async def client():
            while queue:
                tenant, messages = queue.pop()
                outcomes.append(await _one(http, tenant, messages, max_tokens))
                if on_done is not None:
                    on_done(len(outcomes))
        await asyncio.gather(*[client() for _ in range(concurrency)])
    return outcomes


def cache_counters(cluster: Cluster) -> list[dict[str, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for r in cluster.replicas:
        m = {}
        if r.alive():
            text = httpx.get(r.url + "/metrics", timeout=10).text
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    m[s.name] = s.value
        out.append(m)
    return out


def compare_policy(cluster: Cluster, policy: str, items, args) -> dict:
    for r in cluster.replicas:
        httpx.post(r.url + "/flush_cache", timeout=60).raise_for_status()
    cluster.start_router(policy)
    before = cache_counters(cluster)
    t0 = time.perf_counter()
    outcomes = asyncio.run(run_load(cluster.url, items, args.concurrency, args.max_tokens, 600))
    wall = time.perf_counter() - t0
    after = cache_counters(cluster)

    def delta(i: int, name: str) -> float:
        return after[i].get(name, 0.0) - before[i].get(name, 0.0)

    hit = sum(delta(i, "agentlang_prefix_cache_hit_tokens_total") for i in range(len(after)))
    queried = sum(delta(i, "agentlang_prefix_cache_queried_tokens_total")
                  for i in range(len(after)))
    ok = [o for o in outcomes if o.status == "ok"]
    return {"policy": policy, "requests": len(outcomes), "ok": len(ok),
            "hit_rate": round(hit / queried, 4) if queried else 0.0,
            "hit_tokens": int(hit), "queried_tokens": int(queried),
            "per_replica_requests": [int(delta(i, "agentlang_requests_finished_total"))
                                     for i in range(len(after))],
            "wall_s": round(wall, 2), "requests_per_s": round(len(ok) / wall, 3),
            "output_tokens_per_s": round(sum(o.output_tokens for o in ok) / wall, 2),
            "mean_latency_s": round(sum(o.latency_s for o in ok) / max(1, len(ok)), 3)}


def kill_test(cluster: Cluster, items, args) -> dict:
    for r in cluster.replicas:
        httpx.post(r.url + "/flush_cache", timeout=60).raise_for_status()
    cluster.start_router("cache_aware", *FAST_FAILURE)
    victim = cluster.replicas[-1]
    killed_at: list[float] = []

    def on_done(n: int) -> None:
        if n >= args.kill_after and not killed_at:
            victim.kill()
            killed_at.append(time.perf_counter())

    t0 = time.perf_counter()
    outcomes = asyncio.run(run_load(cluster.url, items, args.concurrency, args.max_tokens,
                                    args.client_timeout, on_done))
    wall = time.perf_counter() - t0
    time.sleep(3)                                   # the router's health check notices
    after = asyncio.run(run_load(cluster.url, items[:args.after], args.concurrency,
                                 args.max_tokens, args.client_timeout))
    hung = [o for o in outcomes + after if o.latency_s >= args.client_timeout - 1]
    errors = sorted({o.status for o in outcomes if o.status != "ok"})
    return {"requests": len(outcomes), "ok": sum(o.status == "ok" for o in outcomes),
            "failed": sum(o.status != "ok" for o in outcomes), "error_kinds": errors,
            "killed": victim.name, "killed_after_s": round(killed_at[0] - t0, 2)
            if killed_at else None, "wall_s": round(wall, 2),
            "max_latency_s": round(max(o.latency_s for o in outcomes + after), 2),
            "hung": len(hung), "after_kill_requests": len(after),
            "after_kill_ok": sum(o.status == "ok" for o in after)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--requests", type=int, default=16, help="requests per tenant")
    p.add_argument("--system-tokens", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--kv-budget-mb", type=float, default=240)
    p.add_argument("--policy", nargs="+", default=["cache_aware", "round_robin"])
    p.add_argument("--kill-after", type=int, default=12, help="completions before the kill")
    p.add_argument("--after", type=int, default=8, help="requests after the kill")
    p.add_argument("--client-timeout", type=float, default=300)
    p.add_argument("--no-kill", action="store_true")
    p.add_argument("--quick", action="store_true", help="4 tenants x 4 requests, 300 tokens")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args()
    if args.quick:
        args.tenants, args.requests, args.system_tokens, args.kill_after = 4, 4, 300, 4
    items = workload(args.tenants, args.requests, args.system_tokens)
    results: dict = {"workload": {k: getattr(args, k) for k in (
        "replicas", "tenants", "requests", "system_tokens", "concurrency", "max_tokens",
        "kv_budget_mb")}, "policies": []}
    with start_cluster(args.replicas, "--kv-budget-mb", str(args.kv_budget_mb),
                       policy=None) as cluster:
        for policy in args.policy:
            r = compare_policy(cluster, policy, items, args)
            results["policies"].append(r)
            print(json.dumps(r), flush=True)
        if not args.no_kill:
            results["kill"] = kill_test(cluster, items, args)
            print(json.dumps(results["kill"]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    kill = results.get("kill")
    return 0 if kill is None or (kill["hung"] == 0 and
                                 kill["after_kill_ok"] == kill["after_kill_requests"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
