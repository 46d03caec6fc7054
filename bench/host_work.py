"""Where a batch-1 decode step's time goes: matmul kernels, attention kernels, and the rest
("host work": the small ops and Python between them), on the embedded Q4_1 GGUF.

Step time is the engine's own decode rate (wall clock, no profiler); kernel times come from a
``torch.profiler`` run of the same generation (self CPU time of the kernel ops, per step);
host work = step time − kernel time.

    .venv/bin/python bench/host_work.py [--weights auto] [--dtype bfloat16] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from torch.profiler import profile

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.weights.model_loader import resolve_model

MATMUL_OPS = ("aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int8pack_mm", "aten::mm",
              "aten::addmm", "aten::linear")
ATTENTION_OPS = ("aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_attention_math")


def measure(weights: str, dtype: str, tokens: int, threads: int = 2) -> dict:
    """Per-step milliseconds: ``step``, ``matmul``, ``attention``, ``host`` and op counts."""
    torch.set_num_threads(threads)
    eng = Engine(str(resolve_model("default", weights).path), dtype=dtype, weights=weights,
                 kv_budget_mb=64, enable_prefix_cache=False)
    prompt = eng.tokenizer.encode("Once upon a time")
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    eng.generate(prompt, params)                                          # warm-up
    rates = []
    for _ in range(3):
        out = eng.generate(prompt, params)
        rates.append((out.meta["latency_s"] - out.meta["ttft_s"]) / (tokens - 1))
    step_ms = statistics.median(rates) * 1e3
    with profile() as prof:
        eng.generate(prompt, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
    events = prof.key_averages()
    per_step = lambda names: sum(e.self_cpu_time_total for e in events if e.key in names) / 1e3 / tokens
    n_ops = sum(e.count for e in events if e.key.startswith("aten::")) / tokens
    matmul, attention = per_step(MATMUL_OPS), per_step(ATTENTION_OPS)
    return {"weights": weights, "dtype": dtype, "step_ms": round(step_ms, 2),
            "tok_s": round(1e3 / step_ms, 1), "matmul_ms": round(matmul, 2),
            "attention_ms": round(attention, 2),
            "host_ms": round(step_ms - matmul - attention, 2), "aten_ops_per_step": round(n_ops)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    print(json.dumps(measure(args.weights, args.dtype, args.tokens)))


if __name__ == "__main__":
    main()
