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
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = LlamaConfig(**{**SMOLLM2_SHAPES, **shapes}, vocab_size=len(tok), initializer_range=0.2,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json",
                                                         "chat_template.jinja"):
            shutil.copy(f, out / f.name)
    return out
