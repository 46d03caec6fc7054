"""What each GGUF architecture stores: its HF architecture, its tensors and their shapes, and the
config fields only it has (llama.cpp's tensor and key names).

* ``llama`` / ``mistral`` / ``qwen2``: separate ``attn_q/k/v`` (Qwen2 with biases), ``ffn_gate``
  and ``ffn_up``; llama.cpp interleaves the q/k rows of ``llama`` / ``mistral`` (RoPE pairs),
  which :meth:`~agentlang.runtime.weights.gguf_file.GgufFile.rows` undoes.
* ``qwen3``: as ``qwen2`` without biases, plus ``attn_q_norm`` / ``attn_k_norm`` (one weight of
  ``head_dim`` per layer, shared by the heads); ``attention.key_length`` is the head dim.
* ``phi3`` (Phi-3, Phi-4-mini): q/k/v fused in ``attn_qkv`` (or, as some converters write
  them, separate), gate and up fused in ``ffn_up`` (``2 * ffn`` rows, gate first);
  ``rope.dimension_count`` rotary dims of each head (partial rotary); long-RoPE factors in the
  ``rope_factors_long`` / ``rope_factors_short`` tensors with
  ``rope.scaling.original_context_length`` and ``rope.scaling.attn_factor``.
* ``gemma2`` / ``gemma3``: ``post_attention_norm``, ``ffn_norm`` (before the MLP) and
  ``post_ffw_norm`` (after it), norms stored as ``1 + w``; Gemma 3's ``attn_q_norm`` /
  ``attn_k_norm``. Sliding layers from ``attention.sliding_window`` and
  ``attention.sliding_window_pattern`` (every n-th layer global, or one bool a layer), their
  RoPE base ``rope.freq_base_swa``; ``attn_logit_softcapping`` / ``final_logit_softcapping``.
  Defaults as llama.cpp's: Gemma 2 window 4096, pattern 2, caps 50 / 30, one RoPE base;
  Gemma 3 pattern 6, sliding base 10000, no caps (no window in the file: every layer global).
  The file has no ``query_pre_attn_scalar``: llama.cpp's rule (hidden / heads for the 27B
  models, 46 and 62 layers; else the head dim).
"""

from __future__ import annotations

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "gemma3": "Gemma3ForCausalLM"}
GEMMA = {"gemma2": {"window": 4096, "pattern": 2, "caps": (50.0, 30.0), "big": 46},
         "gemma3": {"window": 0, "pattern": 6, "caps": (0.0, 0.0), "big": 62}}
PERMUTED_QK = ("llama", "mistral")     # archs whose q/k rows llama.cpp interleaves
ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")


def fused_qkv(arch: str, tensor_names) -> bool:
    """The file stores each layer's q/k/v as one ``attn_qkv`` tensor."""
    return arch == "phi3" and "blk.0.attn_qkv.weight" in tensor_names


def layer_shapes(arch: str, tensor_names, H: int, I: int, heads: int, kv: int, hd: int
                 ) -> dict[str, tuple[int, ...]]:
    """Each tensor of a layer (name after ``blk.N.``, without ``.weight``) → its torch shape."""
    shapes = {"attn_norm": (H,), "attn_output": (H, heads * hd), "ffn_norm": (H,),
              "ffn_down": (H, I)}
    if fused_qkv(arch, tensor_names):
        shapes["attn_qkv"] = ((heads + 2 * kv) * hd, H)
    else:
        shapes.update(attn_q=(heads * hd, H), attn_k=(kv * hd, H), attn_v=(kv * hd, H))
    if arch == "phi3":
        shapes["ffn_up"] = (2 * I, H)
    else:
        shapes.update(ffn_gate=(I, H), ffn_up=(I, H))
    if arch in ("qwen3", "gemma3"):
        shapes.update(attn_q_norm=(hd,), attn_k_norm=(hd,))
    if arch in GEMMA:
        shapes.update(post_attention_norm=(H,), post_ffw_norm=(H,))
    return shapes


def arch_config(arch: str, meta: dict, head_dim: int, vectors) -> dict:
    """The config.json fields of ``arch`` beyond the Llama ones; ``vectors(name)`` reads a
    small F32 tensor as a list (None if absent)."""
    a = arch
    if arch in GEMMA:
        return gemma_config(arch, meta, head_dim)
    if arch != "phi3":
        return {}
    out: dict = {"partial_rotary_factor": int(meta.get(f"{a}.rope.dimension_count", head_dim)) / head_dim}
    if meta.get(f"{a}.attention.sliding_window"):
        out["sliding_window"] = int(meta[f"{a}.attention.sliding_window"])
    long, short = (vectors(n) for n in ROPE_FACTORS)
    if long is not None or short is not None:
        rope = {"rope_type": "longrope", "long_factor": long, "short_factor": short,
                "original_max_position_embeddings": meta.get(f"{a}.rope.scaling.original_context_length")}
        if meta.get(f"{a}.rope.scaling.attn_factor") is not None:
            rope["attention_factor"] = float(meta[f"{a}.rope.scaling.attn_factor"])
        out["rope_scaling"] = rope
    return out


def gemma_config(arch: str, meta: dict, head_dim: int) -> dict:
    """Gemma 2 / 3's config.json fields from the file's metadata (module doc)."""
    a, d = arch, GEMMA[arch]
    n = int(meta[f"{a}.block_count"])
    window = int(meta.get(f"{a}.attention.sliding_window", d["window"]) or 0)
    pattern = meta.get(f"{a}.attention.sliding_window_pattern", d["pattern"])
    if isinstance(pattern, (list, tuple)):      # one bool a layer (true: sliding)
        types = [bool(p) for p in pattern]
    else:                                       # every n-th layer global; 0: all sliding
        p = int(pattern)
        types = [p == 0 or (i + 1) % p != 0 for i in range(n)]
    if not window:
        types = [False] * len(types)
    heads = int(meta[f"{a}.attention.head_count"])
    attn_cap, final_cap = d["caps"]
    out = {"hidden_activation": "gelu_pytorch_tanh",
           # one entry a layer; a pattern array of another length is the loader's error
           "layer_types": ["sliding_attention" if t else "full_attention" for t in types],
           "query_pre_attn_scalar": int(meta[f"{a}.embedding_length"]) // heads
           if n == d["big"] else head_dim,
           "attn_logit_softcapping": meta.get(f"{a}.attn_logit_softcapping", attn_cap) or None,
           "final_logit_softcapping": meta.get(f"{a}.final_logit_softcapping", final_cap) or None}
    if window:
        out["sliding_window"] = window
    base = meta.get(f"{a}.rope.freq_base_swa")
    if base is not None or arch == "gemma3":
        out["rope_local_base_freq"] = float(10000.0 if base is None else base)
    return out
