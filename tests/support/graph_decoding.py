"""Decoding helpers for the CUDA-graph tests: a capture that always fails, a tiny random Llama,
and a greedy decoder over a fresh pool whose decode steps go through
:class:`agentlang.runtime.execution.cuda_graph.DecodeGraphs` (captured by ``RerunCapture``) or run eagerly."""

from __future__ import annotations

import torch

from tests.support.greedy_decode import GreedyDecoder
from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
from agentlang.runtime.execution.cuda_graph import make_decode_graphs
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.models.config import LlamaConfig
from agentlang.runtime.models.llama import LlamaModel
from agentlang.runtime.cache.page_allocator import PageAllocator

PAGE = 4


class FailingCapture:
    def __init__(self):
        self.calls = 0

    def capture(self, fn):
        self.calls += 1
        raise RuntimeError("operation not permitted when stream is capturing")


def tiny_model(seed=0) -> LlamaModel:
    cfg = LlamaConfig(architecture="LlamaForCausalLM", vocab_size=97, hidden_size=32,
                      intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                      max_position_embeddings=64, tie_word_embeddings=False,
                      attention_bias=False, eos_token_ids=(), bos_token_id=None)
    torch.manual_seed(seed)
    model = LlamaModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)   # wide: peaked logits, greedy choices far from ties
    return model.eval()


def Decoder(model, graphs_setting, capture, max_batch=8, num_pages=64, backend=None):
    """A greedy decoder over a fresh pool of ``num_pages`` pages; decode steps from graphs made
    by ``make_decode_graphs(graphs_setting, ..., capture)`` (None when they are off)."""
    c = model.config
    backend = backend or TorchAttentionBackend()
    pool = KVPool(KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, torch.float32), PAGE,
                  num_pages=num_pages)
    alloc = PageAllocator(num_pages)
    graphs = make_decode_graphs(graphs_setting, model, pool, backend, alloc, max_batch,
                                c.max_position_embeddings, capture=capture)
    return GreedyDecoder(model, pool, backend, alloc, graphs)


PROMPTS = [[5, 9, 13], [2, 4, 6, 8, 10, 12, 14], [1], [30, 31, 32, 33, 34], [7, 7, 7, 7, 7, 7],
           [40, 41], [50, 52, 54, 56, 58, 60, 62, 64, 66], [3, 1, 4, 1, 5]]
# decode steps over changing subsets: sizes 3 (bucket 4), 5 and 8 (bucket 8), 1, 2
SCHEDULE = [[0, 1, 2]] * 3 + [[0, 1, 2, 3, 4]] * 3 + [list(range(8))] * 4 + [[6]] * 2 + [[5, 7]] * 2


def run_schedule(dec: Decoder, schedule=SCHEDULE) -> list[torch.Tensor]:
    dec.prefill(PROMPTS)
    return [dec.decode(rows) for rows in schedule]
