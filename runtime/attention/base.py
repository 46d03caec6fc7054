"""Attention-backend interface: how a layer writes new K/V into the pool and attends over it.

Every backend takes the same :class:`~agentlang.runtime.attention.forward_batch.ForwardBatch` metadata, so the model
code does not know which one runs. ``torch`` is the CPU path and the reference; ``triton`` runs
the paged kernels of :mod:`kernels` on a GPU.
"""

from __future__ import annotations

from typing import Protocol

import torch

from agentlang.runtime.attention.forward_batch import ForwardBatch
from agentlang.runtime.cache.kv_pool import KVPool


class AttentionBackend(Protocol):
    name: str
    # True when a decode step's launches read, from the host, only values that bound the
    # batch (a longest sequence given as the worst case works for every shorter one), so the
    # step can be captured once in a CUDA graph and replayed on new metadata.
    graph_safe: bool

    def store_kv(
        self, pool: KVPool, layer: int, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> None:
        """Write the new tokens' K/V ``[T, Hkv, D]`` into their slots (``batch.slot_mapping``)."""

    def attend(
        self, q: torch.Tensor, pool: KVPool, layer: int, batch: ForwardBatch, scale: float,
        k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
        window: int = 0, softcap: float = 0.0,
    ) -> torch.Tensor:
        """Causal attention of the new queries ``q [T, Hq, D]`` over each sequence's context
        (its cached prefix plus its own new tokens, already stored). Returns ``[T, Hq, D]``.
        ``window`` (> 0): each query sees only its last ``window`` keys (a sliding layer);
        ``softcap`` (> 0): scores become ``softcap * tanh(score / softcap)`` before the mask
        (:mod:`agentlang.runtime.attention.window`).
        ``k_new, v_new [T, Hkv, D]`` are the new tokens' K/V as passed to ``store_kv``; a
        backend may read them instead of their pool slots when that gives the same result."""

    def copy_pages(self, pool: KVPool, src: list[int], dst: list[int]) -> None:
        """Copy pages ``src[i] -> dst[i]`` in every layer (copy-on-write)."""


ATTENTION_BACKENDS = ("auto", "torch", "triton")


def make_backend(name: str, device: torch.device, bf16_rows: int | None = None
                 ) -> AttentionBackend:
    """``auto`` picks ``triton`` on CUDA and ``torch`` elsewhere; ``bf16_rows``: the torch
    backend's (a float32 model's steps of that many tokens attend in bf16)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        from agentlang.runtime.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend(bf16_rows)
    from agentlang.runtime.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()
