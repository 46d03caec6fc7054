"""KV memory: paged allocation against contiguous max-length reservation, same budget.

One seeded trace of requests with a realistic length spread (lognormal prompts clipped to
50..2000 tokens, lognormal outputs clipped to 20..500, max context 4096) is served by a
simulated continuous-batching loop (admit FIFO, then every running request decodes one token
per step) under one KV budget: the memory that holds 16 contiguous max-context reservations.

* **contiguous** — each request reserves ``max_context`` token slots when admitted (what the
  seeds describe): at most ``budget // max_context`` requests run at once.
* **paged** — each request holds ``ceil(tokens / page_size)`` pages through the real
  :class:`~agentlang.runtime.cache.page_table.PageTable` / :class:`~agentlang.runtime.cache.page_allocator.PageAllocator`,
  growing one token at a time. A request is admitted when its prompt (+1) fits; if a decode
  runs out of pages the newest request is preempted (freed, re-queued at the front, its
  tokens recomputed on re-admission), as the scheduler does.

Reported, over the steps where requests are still waiting (the pool is the bottleneck):
KV waste = (allocated token slots - tokens stored) / allocated slots, the mean number of
requests running concurrently, and the ratio paged / contiguous. (Pages kept free as admission
headroom are not waste by this definition; the "pool used" column shows how full the pool is.) No model runs: only the
memory accounting matters here, so it runs in seconds on a CPU.

    .venv/bin/python bench/kv_memory.py            # prints a table, writes bench/results/kv_memory.json
    .venv/bin/python bench/kv_memory.py --requests 500 --seed 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from agentlang.runtime.cache.kv_pool import KVLayout
from agentlang.runtime.cache.page_allocator import OutOfPagesError, PageAllocator
from agentlang.runtime.cache.page_table import PageTable, kv_usage

# SmolLM2-135M in bf16: 30 layers x K,V x 3 kv heads x 64 dims x 2 bytes = 23040 bytes/token.
SMOLLM2 = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16)


@dataclass(frozen=True)
class Workload:
    requests: int = 2000
    seed: int = 0
    prompt_median: float = 400.0
    prompt_sigma: float = 0.9
    prompt_min: int = 50
    prompt_max: int = 2000
    output_median: float = 120.0
    output_sigma: float = 0.8
    output_min: int = 20
    output_max: int = 500
    max_context: int = 4096
    budget_requests: int = 16      # budget = this many contiguous max-context reservations


@dataclass
class Result:
    policy: str
    page_size: int | None
    waste_pct: float               # over saturated steps, token-slot weighted
    mean_concurrent: float         # running requests per saturated step
    max_concurrent: int
    preemptions: int
    steps: int
    final_waste_pct: float         # per request at its final length (no time weighting)
    pool_used_pct: float           # allocated / budget, over saturated steps


def make_trace(w: Workload) -> list[tuple[int, int]]:
    """(prompt_len, output_len) per request."""
    rng = np.random.default_rng(w.seed)
    p = rng.lognormal(math.log(w.prompt_median), w.prompt_sigma, w.requests)
    o = rng.lognormal(math.log(w.output_median), w.output_sigma, w.requests)
    p = np.clip(np.rint(p), w.prompt_min, w.prompt_max).astype(int)
    o = np.clip(np.rint(o), w.output_min, w.output_max).astype(int)
    return list(zip(p.tolist(), o.tolist()))


def simulate_contiguous(trace, w: Workload) -> Result:
    budget = w.budget_requests * w.max_context
    slots_per_req = w.max_context
    cap = budget // slots_per_req
    waiting = deque(range(len(trace)))
    running: dict[int, int] = {}          # request -> tokens stored
    alloc_sum = stored_sum = conc_sum = sat_steps = steps = max_conc = 0
    while waiting or running:
        while waiting and len(running) < cap:
            r = waiting.popleft()
            running[r] = trace[r][0]
        steps += 1
        for r in list(running):
            running[r] += 1
            if running[r] == sum(trace[r]):
                del running[r]
        if waiting:
            sat_steps += 1
            conc_sum += len(running)
            alloc_sum += (len(running)) * slots_per_req
            stored_sum += sum(running.values())
        max_conc = max(max_conc, len(running))
    final = [slots_per_req - (p + o) for p, o in trace]
    return Result("contiguous", None, 100.0 * (1 - stored_sum / alloc_sum), conc_sum / sat_steps,
                  max_conc, 0, steps, 100.0 * sum(final) / (slots_per_req * len(trace)),
                  100.0 * alloc_sum / (sat_steps * budget))


def simulate_paged(trace, w: Workload, page_size: int, watermark: float = 0.01) -> Result:
    num_pages = w.budget_requests * w.max_context // page_size
    alloc = PageAllocator(num_pages)
    headroom = int(num_pages * watermark)
    nocopy = lambda src, dst: None          # noqa: E731  (no tensors: accounting only)
    waiting = deque((r, 0) for r in range(len(trace)))   # (request, tokens generated so far)
    running: dict[int, tuple[PageTable, int]] = {}      # request -> (table, generated)
    order: list[int] = []                                # admission order, newest last
    alloc_sum = stored_sum = conc_sum = sat_steps = steps = max_conc = preempt = 0
    while waiting or running:
        while waiting:
            r, gen = waiting[0]
            need = trace[r][0] + gen
            if alloc.num_free < -(-(need + 1) // page_size) + headroom and running:
                break
            waiting.popleft()
            t = PageTable(alloc, page_size)
            t.reserve(need, nocopy)          # prefill (recompute after a preemption)
            t.commit(need)
            running[r] = (t, gen)
            order.append(r)
        steps += 1
        for r in list(order):
            if r not in running:
                continue
            t, gen = running[r]
            while True:
                try:
                    t.reserve(1, nocopy)
                    break
                except OutOfPagesError:      # preempt the newest request, recompute later
                    victim = order.pop()
                    vt, vgen = running.pop(victim)
                    vt.free()
                    waiting.appendleft((victim, vgen))
                    preempt += 1
                    if victim == r:
                        break
            if r not in running:
                continue
            t.commit(1)
            gen += 1
            if gen == trace[r][1]:
                t.free()
                del running[r]
                order.remove(r)
            else:
                running[r] = (t, gen)
        tables = [t for t, _ in running.values()]
        if steps % 97 == 0:                  # cross-check the running sums with kv_usage
            u = kv_usage(alloc, page_size, tables)
            assert u.allocated_slots == alloc.num_used * page_size
            assert u.stored_tokens == sum(t.num_tokens for t in tables)
        if waiting:
            sat_steps += 1
            conc_sum += len(running)
            alloc_sum += alloc.num_used * page_size
            stored_sum += sum(t.num_tokens for t in tables)
        max_conc = max(max_conc, len(running))
    assert alloc.num_free == num_pages
    final = [-(-(p + o) // page_size) * page_size - (p + o) for p, o in trace]
    final_alloc = sum(-(-(p + o) // page_size) * page_size for p, o in trace)
    return Result("paged", page_size, 100.0 * (1 - stored_sum / alloc_sum), conc_sum / sat_steps,
                  max_conc, preempt, steps, 100.0 * sum(final) / final_alloc,
                  100.0 * alloc_sum / (sat_steps * num_pages * page_size))


def run(w: Workload, page_sizes: tuple[int, ...] = (1, 16, 32)) -> dict:
    """Simulate the trace under every policy; the paged/contiguous headline uses page 16."""
    trace = make_trace(w)
    t0 = time.perf_counter()
    contiguous = simulate_contiguous(trace, w)
    paged = {ps: simulate_paged(trace, w, ps) for ps in page_sizes}
    lengths = np.array([p + o for p, o in trace])
    budget_tokens = w.budget_requests * w.max_context
    main = paged.get(16) or next(iter(paged.values()))
    return {
        "workload": asdict(w),
        "trace": {
            "prompt_mean": float(np.mean([p for p, _ in trace])),
            "output_mean": float(np.mean([o for _, o in trace])),
            "total_len_mean": float(lengths.mean()),
            "total_len_p50": float(np.percentile(lengths, 50)),
            "total_len_p99": float(np.percentile(lengths, 99)),
        },
        "budget_tokens": budget_tokens,
        "budget_bytes_smollm2_bf16": budget_tokens * SMOLLM2.bytes_per_token(),
        "results": [asdict(contiguous)] + [asdict(r) for r in paged.values()],
        "paged_page_size": main.page_size,
        "paged_waste_pct": main.waste_pct,
        "contiguous_waste_pct": contiguous.waste_pct,
        "concurrency_ratio": main.mean_concurrent / contiguous.mean_concurrent,
        "seconds": time.perf_counter() - t0,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
    }


def print_table(res: dict) -> None:
    tr, w = res["trace"], res["workload"]
    print(f"trace: {w['requests']} requests (seed {w['seed']}), prompt mean {tr['prompt_mean']:.0f}, "
          f"output mean {tr['output_mean']:.0f}, total p50 {tr['total_len_p50']:.0f} / "
          f"p99 {tr['total_len_p99']:.0f}, max_context {w['max_context']}")
    print(f"budget: {res['budget_tokens']} token slots "
          f"({res['budget_bytes_smollm2_bf16'] / 2**30:.2f} GiB of SmolLM2-135M bf16 KV)\n")
    hdr = f"{'policy':<16}{'KV waste %':>11}{'final waste %':>15}{'pool used %':>13}" \
          f"{'mean running':>14}{'max running':>13}{'preempted':>11}{'steps':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in res["results"]:
        name = r["policy"] + (f" (page {r['page_size']})" if r["page_size"] else "")
        print(f"{name:<16}{r['waste_pct']:>11.2f}{r['final_waste_pct']:>15.2f}{r['pool_used_pct']:>13.1f}"
              f"{r['mean_concurrent']:>14.1f}{r['max_concurrent']:>13}{r['preemptions']:>11}"
              f"{r['steps']:>8}")
    ok_w = res["paged_waste_pct"] <= 4.0
    ok_c = res["concurrency_ratio"] >= 3.0
    print(f"\npaged (page {res['paged_page_size']}) waste {res['paged_waste_pct']:.2f}% vs "
          f"contiguous {res['contiguous_waste_pct']:.2f}%  [target <= 4%: {'ok' if ok_w else 'MISSED'}]")
    print(f"concurrent requests: {res['concurrency_ratio']:.2f}x contiguous  "
          f"[target >= 3x: {'ok' if ok_c else 'MISSED'}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=Workload.requests)
    ap.add_argument("--seed", type=int, default=Workload.seed)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kv_memory.json")
    args = ap.parse_args()
    if args.requests < 1:
        raise SystemExit("--requests must be >= 1")
    res = run(Workload(requests=args.requests, seed=args.seed))
    print_table(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"\nwrote {args.out} in {res['seconds']:.1f} s")


if __name__ == "__main__":
    main()
