"""The whole engine on a CUDA GPU: greedy outputs with the ``triton`` attention backend equal
those with the ``torch`` backend, and both backends' generation throughput side by side.

The model is a random-weight Llama with SmolLM2-135M's attention shapes (9 query / 3 KV heads,
head_dim 64, hidden 576) and 8 layers, built on the spot with the embedded model's tokenizer:
the device machine cannot download, and the real weights (270 MB in bf16) exceed what the
device tool carries. Random weights with a wide initialisation give peaked logits, so greedy
choices are far from ties and fp32 outputs must match token for token.

Section ``llama8b`` (:mod:`bench.gpu_llama8b`) then runs a Llama-3-8B-shaped bf16 model:
decode and prefill against the hardware ceilings measured in the same run, CUDA-graph vs eager
greedy tokens, and the engine on the shared-prefix workload.

    python bench/gpu_engine.py --tokenizer DIR   # DIR: tokenizer.json, tokenizer_config.json
                                                 # (e.g. the embedded model's cache folder)
    python bench/gpu_engine.py --tokenizer DIR --dry-run   # CPU, toy sizes: checks the script
Writes ``$OUT/gpu_engine.json`` (or ``bench/results/gpu_engine.json``) after each section.
Exit code 1 when the fp32 outputs differ or CUDA-graph and eager tokens differ, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.models import SMOLLM2_SHAPES, random_llama  # noqa: E402,F401

PROMPTS = [
    "The quick brown fox jumps over the lazy dog because",
    "1 2 3",
    "Write a haiku about paged attention kernels on a GPU.",
    "def fibonacci(n):",
] + [f"System: you are agent {i} of a debate about caching.\nUser: argue point {i}." for i in
     range(12)]


def run_backend(model: Path, backend: str, dtype: str, prompts: list[str], max_tokens: int,
                device: str = "cuda"):
    """Greedy outputs and the wall time of two identical timed passes (cache flushed before
    each) of one engine, created, warmed up and shut down here."""
    from agentlang.runtime import Engine, SamplingParams

    eng = Engine(model=str(model), attention_backend=backend, device=device, dtype=dtype,
                 page_size=16, num_pages=8192, max_running=64)
    assert eng.backend.name == backend, eng.backend.name
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    eng.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0))  # compile, warm up
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    seconds = []
    for _ in range(2):
        eng.flush_cache()
        sync()
        t = time.perf_counter()
        outs = eng.generate(prompts, params)
        sync()
        seconds.append(time.perf_counter() - t)
    eng.shutdown()
    return [o.token_ids for o in outs], seconds


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """Identical outputs and the mean index of the first differing token (its length if none)."""
    first = [next((i for i, (x, y) in enumerate(zip(s, t)) if x != y), len(s)) for s, t in
             zip(a, b)]
    return {"identical": sum(s == t for s, t in zip(a, b)), "of": len(a),
            "mean_first_difference": sum(first) / len(first), "min_first_difference": min(first)}


def backend_check(tokenizer: Path, max_tokens: int, dry: bool, log) -> tuple[dict, bool]:
    """Triton vs torch backend through the whole engine; returns (result, fp32 identical)."""
    device = "cpu" if dry else "cuda"
    prompts = PROMPTS[:2] if dry else PROMPTS * 4
    shapes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, intermediate_size=128) if dry else {}
    result: dict = {"requests": len(prompts), "max_tokens": max_tokens}
    tokens = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = random_llama(tokenizer, Path(tmp), **shapes)
        for dtype in ("float32",) if dry else ("float32", "bfloat16"):
            for backend in ("torch", "triton"):
                toks, secs = run_backend(model, backend, dtype, prompts, max_tokens, device)
                tokens[dtype, backend] = toks
                n = sum(len(t) for t in toks)
                result[f"{dtype} {backend}"] = {"seconds": secs, "tokens": n,
                                                "tok_per_s": [n / s for s in secs]}
                log(f"{dtype:9s} {backend:6s}: {n} tokens, passes "
                    + ", ".join(f"{s:.2f} s ({n / s:.0f} tok/s)" for s in secs))
    pairs = {"float32 triton vs torch": (("float32", "triton"), ("float32", "torch")),
             "bfloat16 triton vs torch": (("bfloat16", "triton"), ("bfloat16", "torch")),
             "bfloat16 torch vs float32 torch": (("bfloat16", "torch"), ("float32", "torch")),
             "bfloat16 triton vs float32 torch": (("bfloat16", "triton"), ("float32", "torch"))}
    for name, (a, b) in pairs.items():
        if a in tokens and b in tokens:
            result[name] = r = agreement(tokens[a], tokens[b])
            log(f"{name:34s}: identical {r['identical']}/{r['of']}, first difference at token "
                f"{r['mean_first_difference']:.1f} on average (earliest {r['min_first_difference']})")
    r = result["float32 triton vs torch"]
    return result, r["identical"] == r["of"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--sections", default="check,llama8b",
                    help="comma-separated: check (triton vs torch backend), llama8b")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, toy sizes, Triton interpreted: checks the script; numbers mean "
                         "nothing, no JSON unless OUT is set")
    args = ap.parse_args()
    sections = args.sections.split(",")
    if set(sections) - {"check", "llama8b"}:
        ap.error(f"--sections: choose from check, llama8b; got {args.sections!r}")
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"      # before the kernels are first imported
    elif not torch.cuda.is_available():
        print("bench/gpu_engine.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    result: dict = {"device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(0)}
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else (
        None if args.dry_run else Path(__file__).parent / "results")
    ok = True

    def save() -> None:
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "gpu_engine.json").write_text(json.dumps(result, indent=1))

    if "check" in sections:
        result["check"], same = backend_check(args.tokenizer, 3 if args.dry_run else
                                              args.max_tokens, args.dry_run, log)
        log(f"fp32 greedy outputs triton == torch: {'yes' if same else 'NO'}")
        ok &= same
        save()
    if "llama8b" in sections:
        from bench.gpu_llama8b import PLANS, run

        result["llama8b"] = r = run(PLANS["dry" if args.dry_run else "gpu"], args.tokenizer, log)
        log(f"CUDA-graph == eager greedy tokens: {'yes' if r['graph_vs_eager']['ok'] else 'NO'}")
        ok &= r["graph_vs_eager"]["ok"]
        save()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
