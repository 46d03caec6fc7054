"""Sliding-window KV on a Gemma-3-shaped model: memory per token, concurrent 8k requests, hits.

The model is a random Gemma 3 with Gemma 3 270M's *KV shape* — 18 layers, one global layer in
six, 1 KV head x 256 dims, a 512-key window, fp32 — and a small hidden size and vocabulary so
that 8k-token prefills take seconds on two cores (KV memory depends on the KV shape only).
The same engine runs twice per part, once with the sliding layers' pool split for the workload
(``window_kv_fraction`` from ``agentlang kv-plan``) and once with ``window_kv_fraction=1``: one
window page per global page, exactly the bytes of full-length KV (the memory every layer would
take without windows).

1. **Memory**: one KV budget; KV bytes per token of an 8k request, the pool's page counts, and
   the peak number of 8k-token requests running at once (measured: the engine admits only what
   fits) for 16 requests submitted together.
2. **Hits with prompts longer than the window**: a 1024-token shared prefix (two windows) +
   distinct 48-token questions, 24 requests 4 at a time; the radix cache's hit rate and the
   tokens prefilled, at a roomy budget and at one so tight that idle windows are evicted. A
   hit is usable only where its last window is resident, so the rate shows what survives.
   (llama.cpp re-prefills on every prefix hit for such models: ggml-org/llama.cpp#21831.)

    .venv/bin/python bench/window_kv.py            # writes bench/results/window_kv.json
    .venv/bin/python bench/window_kv.py --quick    # smaller (smoke)
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentlang.runtime import Engine, SamplingParams  # noqa: E402
from agentlang.runtime.models.kv_plan import plan_for_model, request_bytes  # noqa: E402
from bench.output import write_results  # noqa: E402

WINDOW = 512
SHAPES = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=18, num_attention_heads=4,
              num_key_value_heads=1, head_dim=256, sliding_window=WINDOW, query_pre_attn_scalar=256,
              layer_types=[("full_attention" if i % 6 == 5 else "sliding_attention")
                           for i in range(18)], max_position_embeddings=32768)


def make_model(work: Path) -> Path:
    from tests.support.models import family_dirs

    class Tmp:
        def mktemp(self, name):
            return Path(tempfile.mkdtemp(prefix=name, dir=work))

    return family_dirs(Tmp(), {"gemma3": ("gemma3", SHAPES)})["gemma3"]


def peak_running(eng: Engine, prompts, params) -> tuple[int, float]:
    """Run ``prompts`` together; the most requests running at once (polled) and the wall time."""
    peak, done = [0], threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], eng.metrics()["num_running"])
            time.sleep(0.02)

    t = threading.Thread(target=poll)
    t.start()
    t0 = time.perf_counter()
    eng.generate(prompts, params)
    done.set()
    t.join()
    return peak[0], time.perf_counter() - t0


def memory_part(model: Path, context: int, budget_mb: float, n: int) -> dict:
    fraction = plan_for_model(str(model), context=context, memory_gb=1,
                              model_dtype="float32").window_kv_fraction
    prompts = [[(7 * i + 13 * j) % 5000 + 10 for j in range(context - 4)] for i in range(n)]
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)   # they overlap
    out = {}
    for label, frac in (("windowed", fraction), ("full_length", 1.0)):
        eng = Engine(str(model), kv_budget_mb=budget_mb, window_kv_fraction=frac,
                     max_running=n, enable_prefix_cache=False)
        pool = eng.pool
        peak, wall = peak_running(eng, prompts, params)
        out[label] = {
            "window_kv_fraction": round(frac, 4), "global_pages": pool.num_pages,
            "window_pages": pool.windows.num_window_pages, "pool_bytes": pool.nbytes(),
            "kv_bytes_per_token_at_context": round(
                request_bytes(pool.layout, context, pool.page_size)[0] / context)
            if frac < 1 else pool.layout.bytes_per_token(),
            "peak_running_requests": peak, "wall_s": round(wall, 1)}
        print(f"  {label:12s} fraction {frac:.4f}: {pool.num_pages} global + "
              f"{pool.windows.num_window_pages} window pages, {pool.nbytes() / 2**20:.0f} MiB; "
              f"peak {peak} of {n} {context}-token requests running ({wall:.0f} s)", flush=True)
        del eng
    out["concurrency_ratio"] = round(out["windowed"]["peak_running_requests"]
                                     / max(1, out["full_length"]["peak_running_requests"]), 2)
    return out


HIT_RUNS = (   # label, KV budget MB, window_kv_fraction (None: the default split)
    ("roomy/full_length", 256.0, 1.0), ("roomy/windowed", 256.0, None),
    ("tight/full_length", 64.0, 1.0), ("tight/windowed", 64.0, None),
    ("roomy/scarce_windows", 256.0, 0.01))


def hits_part(model: Path, n: int) -> dict:
    shared = [(11 * j) % 4000 + 20 for j in range(2 * WINDOW)]
    prompts = [shared + [(31 * i + 7 * j) % 4000 + 20 for j in range(48)] for i in range(n)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    out = {}
    for label, mb, frac in HIT_RUNS:
        eng = Engine(str(model), kv_budget_mb=mb, window_kv_fraction=frac, max_running=4,
                     max_batch_tokens=512)
        t0 = time.perf_counter()
        for k in range(0, n, 4):
            eng.generate(prompts[k:k + 4], params)
        m = eng.metrics()
        row = {"kv_budget_mb": mb, "global_pages": eng.pool.num_pages,
               "window_pages": eng.pool.windows.num_window_pages,
               "hit_rate": round(m["prefix_cache_hit_rate"], 3),
               "tokens_prefilled": int(m["prefix_cache_queried_tokens"]
                                       - m["prefix_cache_hit_tokens"]),
               "window_evictions": int(m["window_evictions"]),
               "wall_s": round(time.perf_counter() - t0, 1)}
        out[label] = row
        print(f"  {label:22s} {mb:4.0f} MB, {row['window_pages']} window pages: "
              f"hit rate {row['hit_rate']:.3f}, "
              f"{row['tokens_prefilled']} tokens prefilled, {row['window_evictions']} "
              f"window evictions ({row['wall_s']} s)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    context = 2048 if args.quick else 8192
    with tempfile.TemporaryDirectory() as work:
        model = make_model(Path(work))
        full_request_mb = 18 * 2 * 256 * 4 * context / 2**20
        budget = 3.5 * full_request_mb            # three full-length requests and a half
        print(f"memory: budget {budget:.0f} MB ({context}-token requests)", flush=True)
        memory = memory_part(model, context, budget, 8 if args.quick else 16)
        print("hits: 1024-token shared prefix + 48-token questions", flush=True)
        hits = hits_part(model, 8 if args.quick else 24)
    results = {"machine": platform.processor() or platform.machine(), "context": context,
               "kv_budget_mb": round(budget, 1), "memory": memory, "hits": hits}
    print(f"wrote {write_results('window_kv', results, args.out, args.quick)}")


if __name__ == "__main__":
    main()
