"""What quantizing the activations costs on the embedded model: top-1 agreement and mean KL of
its next-token distributions against the Q4_1 file decoded to float32, with every linear's
input quantized per 32 values to 16 bits (what the native kernels multiply) or to 8 bits
(what llama.cpp's kernels multiply: ``vpmaddubsw``'s twice-as-many products an instruction),
and the native kernels themselves. Greedy continuations of the ``bench/cpu_local.py`` prompts
are scored at their last ``--positions`` tokens.

    .venv/bin/python bench/activation_bits.py [--prompts 10] [--positions 64]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
from agentlang.runtime import Engine, SamplingParams  # noqa: E402
from agentlang.runtime.models.gguf_model import load_gguf_model  # noqa: E402
from agentlang.runtime.weights.model_loader import resolve_model  # noqa: E402
from bench.cpu_local import agreement, all_logits  # noqa: E402


def quantized(x: torch.Tensor, qmax: int) -> torch.Tensor:
    """x with each 32 values q * d, d = max|x| / qmax, q = round(x / d) (the kernels' rule)."""
    b = x.float().reshape(-1, x.shape[-1] // 32, 32)
    amax = b.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, qmax / amax, torch.zeros_like(amax))
    return (torch.round(b * inv) * (amax / qmax)).reshape(x.shape)


def with_activation_bits(model: torch.nn.Module, qmax: int) -> torch.nn.Module:
    """The dense model with every ``nn.Linear``'s input quantized to ``qmax``."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            forward = mod.forward
            mod.forward = lambda x, f=forward: f(quantized(x, qmax))
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--positions", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(2)
    gguf = resolve_model("default", "auto").path
    prompts = json.loads((ROOT / "data" / "kv_quant_prompts.json").read_text())[:args.prompts]
    ref = load_gguf_model(gguf, "dense", torch.float32)
    eng = Engine(str(gguf), weights="dense", kv_budget_mb=256)
    ids = [eng.tokenizer.encode(p) for p in prompts]
    outs = eng.generate(ids, SamplingParams(max_tokens=args.positions, temperature=0, ignore_eos=True))
    seqs = [i + o.token_ids for i, o in zip(ids, outs)]
    refs = [all_logits(ref, s, args.positions) for s in seqs]
    runs = {"native kernels (16-bit)": lambda: load_gguf_model(gguf, "auto", torch.float32),
            "16-bit activations, simulated": lambda: with_activation_bits(
                load_gguf_model(gguf, "dense", torch.float32), 32767),
            "8-bit activations, simulated": lambda: with_activation_bits(
                load_gguf_model(gguf, "dense", torch.float32), 127)}
    for name, make in runs.items():
        r = agreement(make(), seqs, refs, args.positions)
        print(f"{name:32s} top-1 {r['top1_agreement']:.4f}  mean KL {r['mean_kl']:.2e}", flush=True)


if __name__ == "__main__":
    main()
