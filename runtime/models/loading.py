"""Model + tokenizer for a :class:`~runtime.model_loader.ResolvedModel`, in one call.

HF directories load their safetensors as they are (``LlamaModel.from_pretrained``, in
``dtype``). GGUF files load through :func:`~runtime.models.gguf_model.load_gguf_model`
(``weights="auto"`` keeps them quantized) and take their tokenizer from the file's metadata,
converted by transformers once and cached under ``$AGENTLANG_CACHE/tokenizers`` (keyed by the
file's path, size and modification time).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import hashlib
import os
import shutil
from pathlib import Path

import torch

from runtime.model_loader import ResolvedModel, cache_root
from runtime.models.gguf_model import load_gguf_model
from runtime.models.llama import LlamaModel


class LoadedModel(NamedTuple):
    model: LlamaModel
    tokenizer: Any       # a transformers tokenizer


def load_model(resolved: ResolvedModel, weights: str, dtype: torch.dtype,
               device: torch.device) -> LoadedModel:
    """Load ``resolved`` with the ``weights`` setting ("auto" | "dense") in compute ``dtype``."""
    from transformers import AutoTokenizer

    if resolved.is_gguf:
        model = load_gguf_model(resolved.path, weights, dtype, device)
        return LoadedModel(model, gguf_tokenizer(resolved.path))
    model = LlamaModel.from_pretrained(resolved.path, dtype, device)
    return LoadedModel(model, AutoTokenizer.from_pretrained(resolved.path))


def gguf_tokenizer(path: Path) -> Any:
    """The tokenizer stored in GGUF ``path``'s metadata (cached after the first conversion)."""
    from transformers import AutoTokenizer

    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    out = cache_root() / "tokenizers" / f"{path.stem}-{key[:16]}"
    if (out / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, out)       # atomic: a half-written cache is never visible
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)   # another process cached it first
    return tok
