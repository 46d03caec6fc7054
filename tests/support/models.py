"""Small random-weight models for tests and benchmarks (bench/ imports them from here)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

SMOLLM2_SHAPES = dict(hidden_size=576, num_hidden_layers=8, num_attention_heads=9,
                      num_key_value_heads=3, head_dim=64, intermediate_size=1536,
                      max_position_embeddings=8192, tie_word_embeddings=True)


def random_llama(tokenizer_dir: Path, out: Path, seed: int = 0, **shapes) -> Path:
    """Save a random-weight Llama (``shapes``: LlamaConfig fields; default SmolLM2-135M's head
    layout with 8 layers) and ``tokenizer_dir``'s tokenizer files into ``out``. A wide
    initialisation (0.2) gives peaked logits, so greedy choices are far from ties."""
    return random_hf_model("llama", tokenizer_dir, out, seed, **shapes)


def random_hf_model(family: str, tokenizer_dir: Path, out: Path, seed: int = 0, **shapes) -> Path:
    """:func:`random_llama` for any HF family: ``"llama"``, ``"qwen3"``, ``"phi3"``,
    ``"gemma2"``, ``"gemma3"`` (Gemma 3's text model) (its
    ``Config`` / ``ForCausalLM`` classes, ``shapes`` their config fields)."""
    import transformers
    from transformers import AutoTokenizer

    name = {"llama": "Llama", "qwen3": "Qwen3", "phi3": "Phi3", "gemma2": "Gemma2",
            "gemma3": "Gemma3"}[family]
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = "Gemma3TextConfig" if family == "gemma3" else f"{name}Config"
    cfg = getattr(transformers, config)(**{
        **SMOLLM2_SHAPES, "vocab_size": len(tok), "initializer_range": 0.2,
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.eos_token_id, **shapes})
    torch.manual_seed(seed)
    model = getattr(transformers, f"{name}ForCausalLM")(cfg)
    if family != "llama":          # norms initialise to ones (Gemma: zeros, scaling by 1 + w):
        # make swapped or skipped ones show
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if p.ndim == 1 and "norm" in pname:
                    p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json",
                                                         "chat_template.jinja"):
            shutil.copy(f, out / f.name)
    return out


def family_dirs(tmp, families: dict, prefix: str = "", seed: int = 0, **extra) -> dict:
    """``{name: (family, shapes)}`` → ``{name: HF dir}`` of random models (``extra`` overrides
    every model's shapes; ``tmp``: pytest's ``tmp_path_factory``)."""
    from agentlang.runtime.weights.model_loader import resolve_model

    tok = resolve_model().path
    return {name: random_hf_model(fam, tok, tmp.mktemp(prefix + name), seed=seed,
                                  **{**shapes, **extra})
            for name, (fam, shapes) in families.items()}


def hf_models(dirs: dict, **kwargs) -> dict:
    """HF transformers' float32 model of each directory (``kwargs``: ``from_pretrained``'s)."""
    from transformers import AutoModelForCausalLM

    return {n: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kwargs).eval()
            for n, d in dirs.items()}
