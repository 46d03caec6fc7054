"""Llama-family decoder (Llama 2/3, Mistral, Qwen2/3, Phi-3, SmolLM, Gemma 2/3) over the paged KV pool.

The forward pass runs on a *flattened* batch of sequences of different lengths
(:class:`~agentlang.runtime.attention.forward_batch.ForwardBatch`); every layer writes its new K/V into the pool
and attends through page tables via the attention backend. There is no per-request cache.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from agentlang.runtime.attention.base import AttentionBackend
from agentlang.runtime.attention.forward_batch import ForwardBatch
from agentlang.runtime.cache.kv_pool import KVPool
from agentlang.runtime.weights.model_loader import ModelLoadError
from agentlang.runtime.models.config import LlamaConfig
from agentlang.runtime.models.rope import RotaryEmbedding
from agentlang.runtime.quant.native.elementwise import elementwise


class RMSNorm(nn.Module):
    """HF's ``weight * (x * rsqrt(mean(x^2) + eps))`` with the statistics in float32, bitwise.

    ``out_dtype`` (None: the input's) is the dtype of the result: a model whose next matmul
    runs in another dtype (bf16 quantized kernels) gets its input in that dtype from here,
    instead of converting inside every linear. ``scale_in_float`` (Gemma): the weight
    multiplies in float32 before the cast, HF's Gemma order (Llama's casts first)."""

    def __init__(self, dim: int, eps: float, scale_in_float: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.out_dtype: torch.dtype | None = None
        self.scale_in_float = scale_in_float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype == torch.float32:
            h = F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)      # one op, bitwise HF's
            return h if self.out_dtype in (None, h.dtype) else h.to(self.out_dtype)
        if self.scale_in_float:
            h = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
            return h.to(self.out_dtype or x.dtype)
        if self.out_dtype in (None, x.dtype) and (native := self._native(x)) is not None:
            return native.rmsnorm(x, self.weight, self.eps)
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        h = self.weight * h.to(x.dtype)
        return h if self.out_dtype in (None, h.dtype) else h.to(self.out_dtype)

    def add_forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + h, self(x + h))``; on bf16 in one native pass that adds **into x** (the
        caller's x must be its own: a layer's input, never reused)."""
        if (not self.scale_in_float and self.out_dtype in (None, x.dtype)
                and (native := self._native(x, h)) is not None):
            return x, native.rmsnorm(x, self.weight, self.eps, residual=h)
        x = x + h
        return x, self(x)

    def _native(self, *xs: torch.Tensor):
        """The native element-wise kernels where they take this norm's bf16 inputs, or None."""
        native = elementwise()
        return native if native is not None and native.applies(*xs, self.weight) else None


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q, k and v projections fused into one matmul (HF weights are concatenated at load)
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.nh + 2 * self.nkv) * self.hd,
                                  bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)
        self.scale = cfg.attn_scale or self.hd ** -0.5
        if cfg.qk_norm:          # Qwen3, Gemma 3: each q and k head RMS-normalized before RoPE
            self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps, cfg.sandwich_norms)
            self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps, cfg.sandwich_norms)
        self.qk_norm = cfg.qk_norm
        self.window = cfg.layer_windows[layer] if cfg.layer_windows else 0   # 0: global
        self.softcap = cfg.attn_softcap

    def forward(self, x, batch: ForwardBatch, rope: tuple[torch.Tensor, torch.Tensor],
                pool: KVPool, backend: AttentionBackend):
        T = x.shape[0]                                          # x: [T, hidden]
        qkv = self.qkv_proj(x)                                  # [T, (nh + 2 nkv) * hd]
        n_qk = (self.nh + self.nkv) * self.hd
        qk = qkv[:, :n_qk].view(T, self.nh + self.nkv, self.hd)
        if self.qk_norm:
            qk = torch.cat([self.q_norm(qk[:, :self.nh]), self.k_norm(qk[:, self.nh:])], dim=1)
        # q and k heads are adjacent in each row: one rotation for both
        qk = RotaryEmbedding.rotate(qk, *rope)
        q, k = qk[:, :self.nh], qk[:, self.nh:]                 # [T, nh, hd], [T, nkv, hd]
        v = qkv[:, n_qk:].view(T, self.nkv, self.hd)
        backend.store_kv(pool, self.layer, k, v, batch)
        o = backend.attend(q, pool, self.layer, batch, self.scale, k, v,
                           window=self.window, softcap=self.softcap)   # [T, nh, hd]
        return self.o_proj(o.reshape(T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        # gate and up projections fused into one matmul
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gelu = cfg.hidden_act == "gelu_tanh"      # GeGLU (Gemma), else SwiGLU

    def forward(self, x):
        gate_up = self.gate_up_proj(x)                          # [T, 2 * intermediate]
        native = None if self.gelu else elementwise()
        if native is not None and native.applies(gate_up):
            return self.down_proj(native.silu_mul(gate_up))      # one pass (glue.c)
        gate, up = gate_up.chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(act * up)


class DecoderLayer(nn.Module):
    """Llama's pre-norm layer; with ``sandwich_norms`` (Gemma) the attention's output is
    normalized before the residual add (``post_attention_layernorm``) and the MLP sits between
    ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` (HF's names each)."""

    def __init__(self, cfg: LlamaConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        gemma = cfg.sandwich_norms
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, gemma)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, gemma)
        self.sandwich = gemma
        if gemma:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, True)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, True)

    def set_matmul_dtype(self, dtype: torch.dtype) -> None:
        """Feed this layer's linears ``dtype`` inputs (the dtype their kernels compute in): the
        norms before them produce it and the MLP's activation runs in it; residuals (and the
        norms after attention and the MLP) keep the model dtype."""
        self.input_layernorm.out_dtype = dtype
        (self.pre_feedforward_layernorm if self.sandwich else self.post_attention_layernorm).out_dtype = dtype

    def forward(self, x, batch, rope, pool, backend):
        h = self.self_attn(self.input_layernorm(x), batch, rope, pool, backend)
        if not self.sandwich:
            x, normed = self.post_attention_layernorm.add_forward(x, h)
            return x + self.mlp(normed)
        x = x + self.post_attention_layernorm(h)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


def fuse_projections(state: dict[str, torch.Tensor], num_layers: int) -> None:
    """HF ``q/k/v_proj`` → ``qkv_proj`` and ``gate/up_proj`` → ``gate_up_proj``, in place."""
    for i in range(num_layers):
        a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        for kind in ("weight", "bias"):
            parts = [state.pop(f"{a}{p}_proj.{kind}", None) for p in "qkv"]
            if all(t is not None for t in parts):
                state[f"{a}qkv_proj.{kind}"] = torch.cat(parts, dim=0)
        if f"{m}gate_proj.weight" in state:
            state[f"{m}gate_up_proj.weight"] = torch.cat(
                [state.pop(f"{m}gate_proj.weight"), state.pop(f"{m}up_proj.weight")], dim=0)


class LlamaModel(nn.Module):
    """Decoder stack + LM head. ``forward`` returns logits ``[N, V]`` for ``batch.logits_indices``."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.sandwich_norms)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(cfg.rope_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                    cfg.rope_scaling)
        self.local_rope = local_rope(cfg)   # the sliding layers' own base (Gemma 3), or None
        self.native_decoder = None    # agentlang.runtime.models.decode_layer.NativeDecoder, set by the GGUF loader

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool, backend: AttentionBackend,
                between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """``between_layers`` (if given) runs after every layer but the last; it may run other
        batches on ``pool`` as long as they write no page this batch uses."""
        x = self.embed_tokens(batch.input_ids)                  # [T, hidden]
        if self.config.embed_scale != 1.0:                      # Gemma: in the embeddings' dtype
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        rope = self.rope.cos_sin(batch.positions, x.dtype)      # shared by all layers
        local = rope if self.local_rope is None else self.local_rope.cos_sin(batch.positions, x.dtype)
        last = len(self.layers) - 1
        native = self.native_decoder
        step = native.step(batch, pool, rope, None if local is rope else local) \
            if native is not None and native.serves(batch, pool, backend) else None   # layers in C
        if step is not None:                                    # every layer in one call
            x = native.run(x, step, between_layers)
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, batch, local if layer.self_attn.window else rope, pool, backend)
                if between_layers is not None and i < last:
                    between_layers()
        x = self.norm(x[batch.logits_indices])                  # [N, hidden]
        logits = self.lm_head(x).float()                        # [N, V]
        cap = self.config.final_softcap
        return logits if not cap else torch.tanh(logits / cap) * cap

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> "LlamaModel":
        """Load HF-format safetensors weights (names as in ``LlamaForCausalLM``)."""
        path = Path(path)
        cfg = LlamaConfig.from_dir(path)
        with torch.device("meta"):
            model = cls(cfg)
        state: dict[str, torch.Tensor] = {}
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    key = name.removeprefix("model.")
                    if "rotary_emb" in key:
                        continue
                    state[key] = f.get_tensor(name).to(dtype)
                    if cfg.sandwich_norms and key.endswith("norm.weight"):
                        # Gemma's norms scale by 1 + w (HF computes it in float32): kept float32
                        state[key] = f.get_tensor(name).float() + 1.0
        fuse_projections(state, cfg.num_layers)
        if "lm_head.weight" not in state:
            if not cfg.tie_word_embeddings and "embed_tokens.weight" not in state:
                raise ModelLoadError(f"{path}: no lm_head.weight and no embeddings to tie")
            state["lm_head.weight"] = state["embed_tokens.weight"]
        expected = set(model.state_dict().keys())
        missing = expected - set(state)
        if missing:
            raise ModelLoadError(f"{path}: weights missing for {sorted(missing)[:5]} ...")
        model.load_state_dict({k: state[k] for k in expected}, strict=True, assign=True)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        model.rope = RotaryEmbedding(cfg.rope_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                     cfg.rope_scaling).to(torch.device(device))
        model.local_rope = local_rope(cfg, torch.device(device))
        return model.to(device).eval()


def local_rope(cfg: LlamaConfig, device: torch.device | None = None) -> RotaryEmbedding | None:
    """The sliding layers' RoPE table when their base differs from the global layers' (Gemma 3:
    10k vs 1M, and unscaled), else None (every layer shares ``LlamaModel.rope``)."""
    if not cfg.layer_windows or not cfg.local_rope_theta or (
            cfg.local_rope_theta == cfg.rope_theta and cfg.rope_scaling is None):
        return None
    rope = RotaryEmbedding(cfg.rope_dim, cfg.max_position_embeddings, cfg.local_rope_theta, None)
    return rope if device is None else rope.to(device)
