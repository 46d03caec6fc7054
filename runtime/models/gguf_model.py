"""A :class:`~agentlang.runtime.models.llama.LlamaModel` built straight from a GGUF file.

The file is validated in full first (:func:`agentlang.runtime.weights.gguf_file.open_gguf`); then each linear is
built by :class:`~agentlang.runtime.weights.gguf_weights.LinearBuilder` (q/k/v and gate/up fused by row
concatenation, still quantized). With tied embeddings the LM head's quantized table also
serves the embedding lookup (:class:`~agentlang.runtime.quant.quant_linear.QuantEmbedding`).
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch
from torch import nn

from agentlang.runtime.quant.block_linear import BlockLinear
from agentlang.runtime.weights.gguf_arch import fused_qkv
from agentlang.runtime.weights.gguf_file import open_gguf
from agentlang.runtime.weights.gguf_weights import LinearBuilder
from agentlang.runtime.models.config import LlamaConfig
from agentlang.runtime.models.llama import LlamaModel, local_rope
from agentlang.runtime.models.rope import RotaryEmbedding
from agentlang.runtime.models.decode_layer import NativeDecoder
from agentlang.runtime.quant.quant_linear import QuantEmbedding, QuantLinear


def load_gguf_model(path: str | Path, weights: str = "auto", dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu", kernels: str = "auto",
                    bf16_gemm_rows: int | None = None) -> LlamaModel:
    """Load a GGUF of one of :data:`~agentlang.runtime.weights.gguf_arch.ARCHITECTURES`. ``weights="auto"`` keeps Q4_0/Q4_1/Q8_0 tensors
    quantized (CPU only), ``"dense"`` decodes every tensor to ``dtype``. Quantized matmuls run
    natively over the file's blocks where ``agentlang.runtime.quant.native`` runs (``kernels="auto"``), else
    (or with ``kernels="torch"``) in torch's int4/int8 kernels with bf16 activations; other
    activations stay in ``dtype``. ``bf16_gemm_rows``: native weights' calls of this many rows or
    more run as bf16 GEMMs on CPUs with bf16 instructions (None: from
    :data:`~agentlang.runtime.quant.block_linear.BF16_GEMM_ROWS` in a bfloat16 model, never in a
    float32 one; ``runtime/quant/block_linear.py``). Raises :class:`~agentlang.runtime.weights.gguf_file.GgufError`."""
    gf = open_gguf(path)
    device = torch.device(device)
    if weights == "auto" and device.type != "cpu":
        weights = "dense"             # the int4/int8 kernels used here are the CPU ones
    cfg = LlamaConfig.from_dict(gf.config_dict())
    b = LinearBuilder(gf, weights, dtype, kernels, bf16_gemm_rows)
    with torch.device("meta"):
        model = LlamaModel(cfg)
    nh, nkv = cfg.num_heads, cfg.num_kv_heads
    qkv, heads = (["qkv"], [None]) if fused_qkv(gf.arch, gf.tensors) else (["q", "k", "v"], [nh, nkv, None])
    gate_up = ["up"] if gf.arch == "phi3" else ["gate", "up"]      # Phi-3: gate and up in ffn_up
    for i, layer in enumerate(model.layers):
        p = f"blk.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = b.linear([f"{p}attn_{n}.weight" for n in qkv], heads=heads,
                                 biases=[f"{p}attn_{n}.bias" for n in qkv])
        attn.o_proj = b.linear([p + "attn_output.weight"])
        mlp.gate_up_proj = b.linear([f"{p}ffn_{n}.weight" for n in gate_up])
        mlp.down_proj = b.linear([p + "ffn_down.weight"])
        if cfg.qk_norm:
            attn.q_norm.weight = _param(b.vector(p + "attn_q_norm.weight"))
            attn.k_norm.weight = _param(b.vector(p + "attn_k_norm.weight"))
        layer.input_layernorm.weight = _param(b.vector(p + "attn_norm.weight"))
        if cfg.sandwich_norms:       # Gemma (the file stores 1 + w, as the norms scale)
            layer.post_attention_layernorm.weight = _param(b.vector(p + "post_attention_norm.weight"))
            layer.pre_feedforward_layernorm.weight = _param(b.vector(p + "ffn_norm.weight"))
            layer.post_feedforward_layernorm.weight = _param(b.vector(p + "post_ffw_norm.weight"))
        else:
            layer.post_attention_layernorm.weight = _param(b.vector(p + "ffn_norm.weight"))
        dtypes = {getattr(m, "input_dtype", None) for m in (attn.qkv_proj, mlp.gate_up_proj, mlp.down_proj)}
        if len(dtypes) == 1 and None not in dtypes:     # all quantized, one input dtype
            layer.set_matmul_dtype(dtypes.pop())
        release_freed_memory()
    model.norm.weight = _param(b.vector("output_norm.weight"))
    embed = b.linear(["token_embd.weight"])
    model.lm_head = embed if cfg.tie_word_embeddings else b.linear(["output.weight"])
    model.embed_tokens = _embedding(embed, dtype)
    if isinstance(model.lm_head, (QuantLinear, BlockLinear)):
        model.norm.out_dtype = model.lm_head.input_dtype
    release_freed_memory()
    factors = b.vector("rope_freqs.weight")     # llama3-style scaling, as per-frequency divisors
    scaling = cfg.rope_scaling if factors is None else {"rope_type": "factors",
                                                          "factors": factors.float()}
    model.rope = RotaryEmbedding(cfg.rope_dim, cfg.max_position_embeddings, cfg.rope_theta, scaling)
    model.local_rope = local_rope(cfg)
    logging.getLogger(__name__).info("loaded %s: %s", Path(path).name,
             ", ".join(f"{k} -> {v}" for k, v in sorted(b.report.items())))
    model.weights_report = dict(b.report)
    model = model.to(device).eval()
    if b.native is not None and NativeDecoder.eligible(model, dtype):
        model.native_decoder = NativeDecoder(b.native, model)
    return model


def release_freed_memory() -> None:
    """Hand the heap pages freed by the per-tensor decoding back to the OS (glibc
    ``malloc_trim``), so decode transients do not accumulate as fragmented resident memory
    across layers. A no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _param(t: torch.Tensor | None) -> nn.Parameter:
    assert t is not None      # presence checked by open_gguf
    return nn.Parameter(t, requires_grad=False)


def _embedding(table: nn.Module, dtype: torch.dtype) -> nn.Module:
    if isinstance(table, (QuantLinear, BlockLinear)):
        return QuantEmbedding(table, dtype)
    emb = nn.Embedding(table.out_features, table.in_features, device="meta")
    emb.weight = table.weight
    return emb
