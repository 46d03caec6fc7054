"""An HF-format random model written as a GGUF file the way llama.cpp's converter writes its
architecture (tests only): the GGUF load of the same weights can then be checked against HF
transformers running the HF directory, for families whose GGUF HF's own loader cannot read
(Qwen3 with ``head_dim != hidden / heads``, Phi-3's long-RoPE factors)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from tests.support.gguf_files import add_tokenizer

GGUF_ARCH = {"Qwen3ForCausalLM": "qwen3", "Phi3ForCausalLM": "phi3",
             "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3"}
GEMMA_NORMS = {"post_attention_layernorm": "post_attention_norm",   # Gemma's names differ
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
TENSORS = {"self_attn.o_proj": "attn_output", "mlp.down_proj": "ffn_down",
           "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
           "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}


def hf_to_gguf(hf_dir: Path, out: Path, fields: dict, qtype: str = "F32") -> Path:
    """``hf_dir`` (a Qwen3 / Phi-3 model whose vocabulary is ``fields``' tokens) → ``out``,
    matrices in ``qtype`` (F32 or a type the ``gguf`` package quantizes), vectors in F32."""
    import gguf

    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = GGUF_ARCH[cfg["architectures"][0]]
    state = {k.removeprefix("model."): v.float().numpy() for k, v in
             load_file(str(next(hf_dir.glob("*.safetensors")))).items()}
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    hd = cfg.get("head_dim") or hidden // heads
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)        # Gemma 3: the global layers' set
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rope["factor"]))
    if arch == "phi3":
        w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", 1.0)))
        if cfg.get("sliding_window"):
            w.add_sliding_window(cfg["sliding_window"])
        if rope.get("rope_type") == "longrope":
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
            for kind in ("long", "short"):
                w.add_tensor(f"rope_factors_{kind}.weight", np.array(rope[f"{kind}_factor"], np.float32))
    if arch in ("gemma2", "gemma3"):
        gemma_meta(w, arch, cfg)
    add_tokenizer(w, fields)

    def tensor(name, x):
        if x.ndim == 1 or qtype == "F32":
            w.add_tensor(name, np.ascontiguousarray(x, np.float32))
        else:
            t = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(x, np.float32), t), raw_dtype=t)

    names = TENSORS
    if arch in ("gemma2", "gemma3"):        # norms stored as 1 + w, as llama.cpp's converter does
        names = {**TENSORS, **GEMMA_NORMS}
        state = {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in state.items()}
    tensor("token_embd.weight", state.pop("embed_tokens.weight"))
    tensor("output_norm.weight", state.pop("norm.weight"))
    if "lm_head.weight" in state and not cfg.get("tie_word_embeddings"):
        tensor("output.weight", state.pop("lm_head.weight"))
    for i in range(cfg["num_hidden_layers"]):
        for hf_name, name in names.items():
            x = state.pop(f"layers.{i}.{hf_name}.weight", None)
            if x is not None:
                tensor(f"blk.{i}.{name}.weight", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def gemma_meta(w, arch: str, cfg: dict) -> None:
    """Gemma's keys: window, one bool a layer for its pattern, caps, the sliding RoPE base."""
    types = cfg["layer_types"]
    if "sliding_attention" in types:
        w.add_sliding_window(cfg["sliding_window"])
        w.add_array(f"{arch}.attention.sliding_window_pattern",
                    [t == "sliding_attention" for t in types])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key):
            w.add_float32(f"{arch}.{key}", cfg[key])
    rope = cfg.get("rope_parameters") or {}
    local = rope.get("sliding_attention", {}).get("rope_theta")
    if local is not None:
        w.add_float32(f"{arch}.rope.freq_base_swa", float(local))
