"""Model configuration of the decoder families (Llama, Mistral, Qwen2/3, Phi-3), read from an
HF ``config.json`` (or a GGUF's metadata turned into one).

Family differences are fields, not classes: ``qk_norm`` (Qwen3 normalizes each q/k head before
RoPE), ``rotary_dim`` (Phi-4-mini rotates only the first part of each head), ``attention_bias``
(Qwen2), and the RoPE scaling in ``rope_scaling``. Gemma 2 / 3 (:mod:`.gemma_config`) add
GeGLU (``hidden_act``), norms after attention and around the MLP (``sandwich_norms``), the
embedding scale, their attention scale, soft-capping of scores and logits, each layer's
sliding window (``layer_windows``) and the sliding layers' own RoPE base (``local_rope_theta``).

Long-RoPE (Phi-3 / Phi-4-mini) has two factor sets; HF switches from ``short_factor`` to
``long_factor`` when a sequence grows past ``original_max_position_embeddings`` and then
recomputes the whole KV cache. Here the set is chosen once per model, by the context it is
served with — long iff ``max_position_embeddings > original_max_position_embeddings``, as
llama.cpp chooses by its context size — so a position's rotation is a function of the position
alone and cached KV, chunked prefill and batching cannot change any output. (HF's no-cache
forward is matched exactly for sequences longer than the original context when the long set is
in use, and for every sequence when the served context is the original one.)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from agentlang.runtime.models.gemma_config import GEMMA_ARCHITECTURES, gemma_fields
from agentlang.runtime.weights.model_loader import ModelLoadError, SUPPORTED_ARCHITECTURES

ROPE_TYPES = ("default", "linear", "llama3", "longrope")


@dataclass(frozen=True)
class LlamaConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None      # {"rope_type": "linear"|"llama3"|"longrope", ...} or None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    qk_norm: bool = False          # RMSNorm over each q and k head before RoPE (Qwen3)
    rotary_dim: int = 0            # leading dims of a head that RoPE rotates; 0: all of them
    hidden_act: str = "silu"       # the MLP's gate activation: "silu" or "gelu_tanh" (Gemma)
    sandwich_norms: bool = False   # Gemma: a norm after attention, and before and after the MLP
    embed_scale: float = 1.0       # Gemma: the embeddings times sqrt(hidden)
    attn_scale: float = 0.0        # scores' scale; 0: head_dim ** -0.5
    attn_softcap: float = 0.0      # scores -> cap * tanh(scores / cap) (Gemma 2); 0: none
    final_softcap: float = 0.0     # the same for the logits
    layer_windows: tuple[int, ...] = ()   # each layer's sliding window (0: global); (): none
    local_rope_theta: float = 0.0  # RoPE base of the sliding layers (Gemma 3); 0: rope_theta

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict) -> "LlamaConfig":
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ModelLoadError(
                f"unsupported architecture {archs or '(none)'}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        gemma = gemma_fields(cfg, arch, head_dim) if arch in GEMMA_ARCHITECTURES else {}
        rope = dict(gemma.pop("global_rope", None) or cfg.get("rope_parameters")
                    or cfg.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        partial = float(rope.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
        rotary_dim = int(head_dim * partial)
        if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
            raise ModelLoadError(f"partial_rotary_factor {partial} gives {rotary_dim} rotary dims "
                                 f"of a {head_dim}-dim head; it must give an even number in 2..{head_dim}")
        max_pos = int(cfg.get("max_position_embeddings", 4096))
        window = cfg.get("sliding_window")
        if window and arch == "Phi3ForCausalLM" and int(window) < max_pos:
            # HF's mask lets position p see keys (p - window, p]: for sequences no longer than
            # the window that is full causal attention, so serve exactly that context.
            max_pos = int(window)
        scaling = _rope_scaling(rope, cfg, rotary_dim, max_pos)
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", arch in GEMMA_ARCHITECTURES)),
            attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            qk_norm=arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM"),
            rotary_dim=0 if rotary_dim == head_dim else rotary_dim,
            **gemma,
        )

    @classmethod
    def from_dir(cls, path: Path) -> "LlamaConfig":
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()))


def _rope_scaling(rope: dict, cfg: dict, rotary_dim: int, max_pos: int) -> dict | None:
    """The ``rope_scaling`` field: None, or the dict :func:`~agentlang.runtime.models.rope.rope_inv_freq`
    reads. Long-RoPE is resolved here to the one factor set this context uses (module doc) and
    its attention factor (HF's default ``sqrt(1 + ln(factor) / ln(original context))``)."""
    rtype = rope.get("rope_type", rope.get("type", "default"))
    rtype = "longrope" if rtype == "su" else rtype
    if rtype not in ROPE_TYPES:
        raise ModelLoadError(f"unsupported rope_type {rtype!r}; supported: {', '.join(ROPE_TYPES)}")
    if rtype == "default":
        return None
    if rtype != "longrope":
        return {**rope, "rope_type": rtype}
    orig = rope.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    if orig is None:
        raise ModelLoadError("rope_type 'longrope' needs original_max_position_embeddings")
    orig = int(orig)
    use_long = max_pos > orig
    name = "long_factor" if use_long else "short_factor"
    factors = rope.get(name)
    if not isinstance(factors, (list, tuple)) or len(factors) != rotary_dim // 2:
        found = "missing" if factors is None else f"{len(factors)} values" \
            if isinstance(factors, (list, tuple)) else repr(factors)
        raise ModelLoadError(f"longrope {name}: {found}; the rotary dims ({rotary_dim}) need "
                             f"{rotary_dim // 2} values")
    factor = rope.get("factor") or int(cfg.get("max_position_embeddings", max_pos)) / orig
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    return {"rope_type": "longrope", "ext_factors": [float(f) for f in factors],
            "attention_factor": float(attention), "original_max_position_embeddings": orig,
            "long": use_long}
