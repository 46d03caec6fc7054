"""Engine throughput vs HF transformers `generate`, side by side, same model/dtype/machine.

Workloads (greedy, ignore_eos):
  shared-prefix chat  64 × (one ~1024-token system prompt + unique ~32-token question), 32 new
  independent         64 unique prompts of 64–512 tokens, 32–128 new tokens
Baseline: HF `generate` in batches of 8 with left padding (each batch runs to its longest
max_new_tokens; only the requested tokens count as output).

    python bench/throughput.py [--dtype float32 bfloat16] [--requests 64] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.output import write_results  # noqa: E402
from bench.workloads import independent, shared_prefix_chat  # noqa: E402
from agentlang.runtime import Engine, SamplingParams  # noqa: E402
from agentlang.runtime.weights.model_loader import resolve_model  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_engine(engine: Engine, items) -> dict:
    engine.flush_cache()
    engine.reset_peak()
    m0 = engine.metrics()
    params = [SamplingParams(max_tokens=it.max_new_tokens, temperature=0, ignore_eos=True)
              for it in items]
    t = time.perf_counter()
    outs = engine.generate([it.prompt_ids for it in items], params)
    wall = time.perf_counter() - t
    m1 = engine.metrics()
    n_out = sum(len(o.token_ids) for o in outs)
    q = m1["prefix_cache_queried_tokens"] - m0["prefix_cache_queried_tokens"]
    h = m1["prefix_cache_hit_tokens"] - m0["prefix_cache_hit_tokens"]
    return {"wall_s": wall, "output_tokens": n_out, "tokens_per_s": n_out / wall,
            "mean_ttft_s": sum(o.meta["ttft_s"] for o in outs) / len(outs),
            "cache_hit_rate": h / q if q else 0.0, "peak_kv_pages": m1["peak_pages_used"],
            "page_size": engine.config.page_size, "tokens_run": m1["tokens_run"] - m0["tokens_run"]}


def run_hf(model, pad_id: int, items, batch_size: int = 8) -> dict:
    n_out, ttfts = 0, []
    t = time.perf_counter()
    for i in tqdm(range(0, len(items), batch_size), desc="  HF batches", leave=False):
        chunk = items[i:i + batch_size]
        width = max(len(it.prompt_ids) for it in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, it in enumerate(chunk):
            ids[r, width - len(it.prompt_ids):] = torch.tensor(it.prompt_ids)
            mask[r, width - len(it.prompt_ids):] = 1
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                           max_new_tokens=max(it.max_new_tokens for it in chunk),
                           min_new_tokens=max(it.max_new_tokens for it in chunk),
                           pad_token_id=pad_id)
        # TTFT of a request in a static batch ≈ time until its batch started + batch prefill
        ttfts += [start - t] * len(chunk)
        n_out += sum(it.max_new_tokens for it in chunk)
    wall = time.perf_counter() - t
    return {"wall_s": wall, "output_tokens": n_out, "tokens_per_s": n_out / wall,
            "mean_ttft_s_lower_bound": sum(ttfts) / len(ttfts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES))
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="16 requests, shorter prompts")
    ap.add_argument("--workloads", nargs="+", default=["shared_prefix_chat", "independent"],
                    choices=["shared_prefix_chat", "independent"])
    ap.add_argument("--weights", default="dense", choices=["dense", "auto"],
                    help="agentlang's weights: dense (HF-exact) or auto (the GGUF's quantized "
                         "tensors, native or int4/int8 matmuls); HF always runs dense")
    ap.add_argument("--hf-dtype", choices=list(DTYPES),
                    help="HF's dtype (default: each --dtype; e.g. --weights auto --dtype "
                         "float32 --hf-dtype bfloat16: quantized agentlang vs HF bf16)")
    ap.add_argument("--out", help="JSON output (default: bench/results/throughput.json; "
                    "a --quick run: a temporary directory)")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model().path
    tok = AutoTokenizer.from_pretrained(path)
    n = 16 if args.quick else args.requests
    workloads = {
        "shared_prefix_chat": shared_prefix_chat(tok, n, 512 if args.quick else 1024),
        "independent": independent(tok, n),
    }
    workloads = {k: v for k, v in workloads.items() if k in args.workloads}
    results = {"machine": "2-core x86_64 CPU, 24 GiB", "model": "SmolLM2-135M-Instruct",
               "torch_threads": torch.get_num_threads(), "runs": []}
    for dtype in args.dtype:
        engine = Engine(resolve_model("default", args.weights).path, dtype=dtype,
                        weights=args.weights, page_size=16, kv_budget_mb=1024,
                        max_batch_tokens=2048, max_running=64)
        hf_dtype = args.hf_dtype or dtype
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[hf_dtype]).eval()
        for name, items in workloads.items():
            print(f"[{dtype}] {name}: {len(items)} requests", flush=True)
            engine.generate(items[0].prompt_ids, SamplingParams(max_tokens=2))  # warm-up
            ours = run_engine(engine, items)
            base = run_hf(hf, tok.pad_token_id or 0, items)
            ratio = ours["tokens_per_s"] / base["tokens_per_s"]
            results["runs"].append({"dtype": dtype, "hf_dtype": hf_dtype, "weights": args.weights,
                                    "workload": name, "requests": len(items),
                                    "agentlang": ours, "hf": base, "speedup": ratio})
            print(f"  agentlang {ours['tokens_per_s']:8.1f} tok/s  wall {ours['wall_s']:6.1f}s  "
                  f"TTFT {ours['mean_ttft_s']:.2f}s  hit {ours['cache_hit_rate']:.2f}  "
                  f"peak pages {ours['peak_kv_pages']}", flush=True)
            print(f"  HF        {base['tokens_per_s']:8.1f} tok/s  wall {base['wall_s']:6.1f}s  "
                  f"→ speedup {ratio:.2f}×", flush=True)
    out = write_results("throughput", results, args.out, args.quick)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
