"""Rotary position embeddings (HF "rotate half" layout) with linear, llama3 and long-RoPE
scaling, over all of a head or its leading ``rotary_dim`` dimensions (partial rotary)."""

from __future__ import annotations

import math

import torch

from agentlang.runtime.quant.native.elementwise import elementwise


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim/2]`` (float32), scaled as the config asks. ``head_dim``
    is the number of dimensions rotated (the rotary dims under partial rotary)."""
    if scaling is not None and scaling["rope_type"] == "longrope":   # HF's order of operations
        ext = torch.tensor(scaling["ext_factors"], dtype=torch.float32)
        return 1.0 / (ext * theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv
    if scaling["rope_type"] == "linear":
        return inv / float(scaling["factor"])
    if scaling["rope_type"] == "factors":        # GGUF rope_freqs: one divisor per frequency
        return inv / scaling["factors"]
    # llama3: long wavelengths are slowed by `factor`, short ones kept, smooth ramp between.
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    low_wl, high_wl = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return torch.where(is_mid, mid, scaled)


class RotaryEmbedding:
    """Precomputed cos/sin table ``[max_pos, D]`` in float32, ``D`` the rotated dims of a head
    (long-RoPE's attention factor multiplied in, as HF does)."""

    def __init__(self, head_dim: int, max_pos: int, theta: float, scaling: dict | None):
        inv = rope_inv_freq(head_dim, theta, scaling)
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)  # [max_pos, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()
        attention = (scaling or {}).get("attention_factor", 1.0)
        if attention != 1.0:
            self.cos, self.sin = self.cos * attention, self.sin * attention
        self.max_pos = max_pos

    def to(self, device: torch.device) -> "RotaryEmbedding":
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        return self

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotation of each position, ``(cos, signed_sin)``, each ``[T, 1, D]``: computed once
        per step and shared by every layer. ``signed_sin`` is ``sin`` with its first half negated,
        which turns HF's ``rotate_half`` into a plain roll (see :meth:`rotate`)."""
        sin = self.sin[positions].unsqueeze(1)
        half = sin.shape[-1] // 2
        signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        return self.cos[positions].unsqueeze(1).to(dtype), signed.to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """x: [T, H, hd] rotated by ``cos_sin`` of its positions. Bitwise HF's
        ``x * cos + rotate_half(x) * sin`` (``rotate_half(x) = [-x2, x1]``; ``-x2 * s`` is
        ``x2 * -s`` exactly), with ``roll`` instead of slices, a negation and a concatenation.
        A table narrower than the heads (partial rotary, ``D < hd``) rotates ``x[..., :D]`` and
        passes the rest through, as HF's Phi-3 does."""
        d = cos.shape[-1]
        native = elementwise() if x.dtype == torch.bfloat16 and x.device.type == "cpu" else None
        if (native is not None and d == x.shape[-1] and x.stride(-1) == 1
                and x.stride(-2) == d and native.applies(cos, signed_sin)):
            return native.rope(x, cos, signed_sin)             # bf16 on CPU: one pass (glue.c)
        if d < x.shape[-1]:
            rot = x[..., :d]
            return torch.cat([rot * cos + torch.roll(rot, d // 2, dims=-1) * signed_sin,
                              x[..., d:]], dim=-1)
        return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, H, D]; positions: [T] -> rotated x, same dtype."""
        return self.rotate(x, *self.cos_sin(positions, x.dtype))
