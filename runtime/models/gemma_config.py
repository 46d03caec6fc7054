"""The config fields of Gemma 2 and Gemma 3 text models, read from an HF ``config.json`` (or a
GGUF's metadata turned into one by :mod:`agentlang.runtime.weights.gguf_arch`).

* Layers: ``layer_types`` (``"sliding_attention"`` / ``"full_attention"`` per layer) or, in older
  configs, ``sliding_window_pattern`` (every ``n``-th layer global: Gemma 3's 6, Gemma 2's 2);
  sliding layers see their last ``sliding_window`` keys.
* RoPE: transformers 5 writes ``rope_parameters`` per layer type; older configs ``rope_theta``
  (global), ``rope_local_base_freq`` (Gemma 3's sliding layers; Gemma 2 uses one base) and
  ``rope_scaling`` (the global layers only, e.g. Gemma 3 4B's linear factor 8).
* Scores scaled by ``query_pre_attn_scalar ** -0.5``; ``attn_logit_softcapping`` and
  ``final_logit_softcapping`` cap scores and logits (Gemma 2; None: no cap).
* GeGLU (``hidden_activation`` ``gelu_pytorch_tanh``), embeddings times ``sqrt(hidden_size)``,
  norms whose HF weights ``w`` scale by ``1 + w`` (the loader adds the 1; GGUF files store it).

Every value is checked: a contradiction or a value out of range raises
:class:`~agentlang.runtime.weights.model_loader.ModelLoadError` naming the field before any weight
is read.
"""

from __future__ import annotations

import math

from agentlang.runtime.weights.model_loader import ModelLoadError

GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
LAYER_TYPES = ("sliding_attention", "full_attention")
PATTERN = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 6}        # HF's defaults
THETA = {"Gemma2ForCausalLM": (10000.0, None), "Gemma3ForCausalLM": (1_000_000.0, 10000.0)}
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def gemma_fields(cfg: dict, arch: str, head_dim: int) -> dict:
    """:class:`~agentlang.runtime.models.config.LlamaConfig` fields of a Gemma config, plus
    ``global_rope``: the global layers' RoPE parameters (``rope_theta`` and any scaling)."""
    n = int(cfg["num_hidden_layers"])
    if cfg.get("use_bidirectional_attention"):
        raise ModelLoadError("use_bidirectional_attention: true is not supported (an embedding "
                             "model); this runtime serves causal decoders")
    types = cfg.get("layer_types")
    if types is None:
        pattern = cfg.get("sliding_window_pattern", PATTERN[arch])
        if not isinstance(pattern, int) or pattern < 1:
            raise ModelLoadError(f"sliding_window_pattern {pattern!r}: it must be an integer >= 1")
        types = [LAYER_TYPES[0] if (i + 1) % pattern else LAYER_TYPES[1] for i in range(n)]
    if not isinstance(types, (list, tuple)) or len(types) != n:
        count = len(types) if isinstance(types, (list, tuple)) else repr(types)
        raise ModelLoadError(f"layer_types has {count} entries but num_hidden_layers is {n}: "
                             "one per layer")
    if not set(types) <= set(LAYER_TYPES):
        raise ModelLoadError(f"layer_types: {sorted(set(types) - set(LAYER_TYPES))} not "
                             f"accepted; each entry is one of {', '.join(LAYER_TYPES)}")
    window = cfg.get("sliding_window")
    if LAYER_TYPES[0] in types:
        context = int(cfg.get("max_position_embeddings", 4096))
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ModelLoadError(f"sliding_window {window!r}: the sliding layers need a "
                                 "positive integer")
        if window > context:
            raise ModelLoadError(f"sliding_window {window} is larger than the context "
                                 f"(max_position_embeddings {context})")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise ModelLoadError(f"hidden_activation {act!r}: accepted {', '.join(ACTIVATIONS)}")
    glob, local_theta = _rope(cfg, arch)
    return {
        "hidden_act": ACTIVATIONS[act],
        "sandwich_norms": True,
        "embed_scale": float(cfg["hidden_size"]) ** 0.5,
        "attn_scale": _positive(cfg, "query_pre_attn_scalar", 256.0) ** -0.5,
        "attn_softcap": _positive(cfg, "attn_logit_softcapping", 0.0),
        "final_softcap": _positive(cfg, "final_logit_softcapping", 0.0),
        "layer_windows": tuple(window if t == LAYER_TYPES[0] else 0 for t in types),
        "local_rope_theta": local_theta,
        "global_rope": glob,
    }


def layer_windows(cfg: dict, head_dim: int) -> tuple[int, ...]:
    """Each layer's sliding window of an HF config dict (0: global), () if not a Gemma's."""
    arch = next((a for a in cfg.get("architectures") or () if a in GEMMA_ARCHITECTURES), None)
    return gemma_fields(cfg, arch, head_dim)["layer_windows"] if arch else ()


def _positive(cfg: dict, field: str, default: float) -> float:
    """A positive finite number (None or absent: ``default``)."""
    value = cfg.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ModelLoadError(f"{field} {value!r}: it must be a positive finite number or null")
    return float(value)


def _rope(cfg: dict, arch: str) -> tuple[dict, float]:
    """(the global layers' RoPE parameters, the sliding layers' base)."""
    glob_theta, local_theta = THETA[arch]
    params = cfg.get("rope_parameters") or {}
    if any(t in params for t in LAYER_TYPES):          # transformers 5: one set a layer type
        glob = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:
        glob = dict(params or cfg.get("rope_scaling") or {})
        local = {"rope_theta": cfg.get("rope_local_base_freq")}
    glob.setdefault("rope_theta", cfg.get("rope_theta", glob_theta))
    kind = local.get("rope_type", local.get("type", "default"))
    if kind != "default":
        raise ModelLoadError(f"rope_parameters.sliding_attention: rope_type {kind!r} is not "
                             "supported; the sliding layers take 'default'")
    theta = local.get("rope_theta")
    if theta is None:
        theta = local_theta if local_theta is not None else glob["rope_theta"]
    return glob, float(theta)
