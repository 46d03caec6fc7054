"""The whole engine on a CUDA GPU: greedy outputs with the ``triton`` attention backend equal
those with the ``torch`` backend, and both backends' generation throughput side by side.

The model is a random-weight Llama with SmolLM2-135M's attention shapes (9 query / 3 KV heads,
head_dim 64, hidden 576) and 8 layers, built on the spot with the embedded model's tokenizer:
the device machine cannot download, and the real weights (270 MB in bf16) exceed what the
device tool carries. Random weights with a wide initialisation give peaked logits, so greedy
choices are far from ties and fp32 outputs must match token for token.

    python bench/gpu_engine.py --tokenizer DIR   # DIR: tokenizer.json, tokenizer_config.json
                                                 # (e.g. the embedded model's cache folder)
Writes ``$OUT/gpu_engine.json`` (or ``bench/results/gpu_engine.json``). Exit code 1 when the
fp32 outputs differ, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = [
    "The quick brown fox jumps over the lazy dog because",
    "1 2 3",
    "Write a haiku about paged attention kernels on a GPU.",
    "def fibonacci(n):",
] + [f"System: you are agent {i} of a debate about caching.\nUser: argue point {i}." for i in
     range(12)]


def build_model(tokenizer_dir: Path, out: Path) -> Path:
    """A random Llama with SmolLM2-135M's head layout, saved beside the tokenizer files."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = LlamaConfig(
        hidden_size=576, num_hidden_layers=8, num_attention_heads=9, num_key_value_heads=3,
        head_dim=64, intermediate_size=1536, vocab_size=len(tok), max_position_embeddings=8192,
        initializer_range=0.2, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json",
                                                         "chat_template.jinja"):
            shutil.copy(f, out / f.name)
    return out


def run_backend(model: Path, backend: str, dtype: str, prompts: list[str], max_tokens: int,
                device: str = "cuda"):
    """Greedy outputs and wall time of one engine (created, warmed up, timed, shut down)."""
    from runtime import Engine, SamplingParams

    eng = Engine(model=str(model), attention_backend=backend, device=device, dtype=dtype,
                 page_size=16, num_pages=8192, max_running=64)
    assert eng.backend.name == backend, eng.backend.name
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    eng.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0))  # compile, warm up
    eng.flush_cache()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    outs = eng.generate(prompts, params)
    sync()
    seconds = time.perf_counter() - t
    eng.shutdown()
    tokens = [o.token_ids for o in outs]
    return tokens, seconds, sum(len(x) for x in tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_engine.py needs a CUDA GPU", file=sys.stderr)
        return 2
    result: dict = {"device": torch.cuda.get_device_name(0)}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(args.tokenizer, Path(tmp))
        for dtype in ("float32", "bfloat16"):
            runs = {b: run_backend(model, b, dtype, PROMPTS * 4, args.max_tokens)
                    for b in ("torch", "triton")}
            same = sum(a == b for a, b in zip(runs["torch"][0], runs["triton"][0]))
            row = {"requests": len(PROMPTS) * 4, "identical_outputs": same}
            for b, (_, secs, n) in runs.items():
                row[b] = {"seconds": secs, "tokens": n, "tok_per_s": n / secs}
            row["triton_over_torch_throughput"] = row["triton"]["tok_per_s"] / row["torch"]["tok_per_s"]
            result[dtype] = row
            print(f"{dtype:9s}: identical greedy outputs {same}/{row['requests']}; tok/s torch "
                  f"{row['torch']['tok_per_s']:.0f}, triton {row['triton']['tok_per_s']:.0f} "
                  f"({row['triton_over_torch_throughput']:.2f}x)", flush=True)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).parent / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_engine.json").write_text(json.dumps(result, indent=1))
    ok = result["float32"]["identical_outputs"] == result["float32"]["requests"]
    print("fp32 greedy outputs triton == torch:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
