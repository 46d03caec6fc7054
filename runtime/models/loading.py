"""Model + tokenizer for a :class:`~agentlang.runtime.weights.model_loader.ResolvedModel`, in one call.

HF directories load their safetensors as they are (``LlamaModel.from_pretrained``, in
``dtype``). GGUF files load through :func:`~agentlang.runtime.models.gguf_model.load_gguf_model`
(``weights="auto"`` keeps them quantized) and take their tokenizer from the file's metadata,
converted by transformers once and cached under ``$AGENTLANG_CACHE/tokenizers`` (keyed by the
file's path, size and modification time) beside a ``config.json`` written from the same metadata:
that directory is the model's HF-style view (``LoadedModel.hf_dir``), what SGLang's clients and
router expect at ``model_path`` / ``tokenizer_path``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from agentlang.runtime.weights.model_loader import ResolvedModel, cache_root
from agentlang.runtime.models.gguf_model import load_gguf_model
from agentlang.runtime.models.llama import LlamaModel
from agentlang.runtime.models.packed_linear import pack_linears
from agentlang.runtime.models.int8_calibration import quantize_model


class LoadedModel(NamedTuple):
    model: LlamaModel
    tokenizer: Any       # a transformers tokenizer
    hf_dir: Path         # a directory with config.json and the tokenizer's files


def load_model(resolved: ResolvedModel, weights: str, dtype: torch.dtype,
               device: torch.device, bf16_gemm_rows: int | None = None) -> LoadedModel:
    """Load ``resolved`` with the ``weights`` setting ("auto" | "dense" | "int8") in compute
    ``dtype`` (``bf16_gemm_rows``: a GGUF's native weights, :func:`load_gguf_model`). Dense CPU linears are then packed for oneDNN (:func:`pack_linears`), or with
    ``"int8"`` quantized (:func:`~agentlang.runtime.quant.int8_linear.int8_linears`)."""
    from transformers import AutoTokenizer

    if resolved.is_gguf:
        model = load_gguf_model(resolved.path, "dense" if weights == "int8" else weights, dtype,
                                device, bf16_gemm_rows=bf16_gemm_rows)
        hf_dir = gguf_hf_dir(resolved.path)
    else:
        model, hf_dir = LlamaModel.from_pretrained(resolved.path, dtype, device), resolved.path
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    if weights == "int8":           # calibrated on a built-in text first (int8_calibration)
        quantize_model(model, tokenizer)
    else:
        pack_linears(model)
    return LoadedModel(model, tokenizer, hf_dir)


def gguf_hf_dir(path: Path) -> Path:
    """The HF-style directory of GGUF ``path``: its tokenizer (converted from the metadata by
    transformers) and ``config.json``, written once and cached."""
    from transformers import AutoTokenizer

    from agentlang.runtime.weights.gguf_file import open_gguf

    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    out = cache_root() / "tokenizers" / f"{path.stem}-{key[:16]}-hf"
    if (out / "config.json").exists():
        return out
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tok.save_pretrained(tmp)
    (tmp / "config.json").write_text(json.dumps(open_gguf(path).config_dict(), indent=2))
    try:
        os.replace(tmp, out)       # atomic: a half-written cache is never visible
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)   # another process cached it first
    return out
