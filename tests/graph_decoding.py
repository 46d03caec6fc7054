"""Decoding helpers for the CUDA-graph tests: a fake capture (its "graph" re-runs the captured
callable on the same static buffers), a tiny random Llama, and a greedy decoder over one pool
whose decode steps go through :class:`runtime.cuda_graph.DecodeGraphs` or run eagerly."""

from __future__ import annotations

import torch

from runtime.attention.torch_backend import TorchAttentionBackend
from runtime.cuda_graph import make_decode_graphs
from runtime.forward_batch import build_forward_batch
from runtime.kv_pool import KVLayout, KVPool
from runtime.models.config import LlamaConfig
from runtime.models.llama import LlamaModel
from runtime.page_allocator import PageAllocator

PAGE = 4


class FakeGraph:
    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())   # a graph writes its captured output tensor in place


class FakeCapture:
    def __init__(self):
        self.captured = 0

    def capture(self, fn):
        out = fn()
        self.captured += 1
        return FakeGraph(fn, out), out


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


class Decoder:
    """Greedy decoding of several prompts over one pool, pages allocated as tokens arrive;
    ``graphs`` (or None: eager) runs the decode steps."""

    def __init__(self, model, graphs_setting, capture, max_batch=8, num_pages=64, backend=None):
        c = model.config
        self.model, self.backend = model, backend or TorchAttentionBackend()
        self.pool = KVPool(KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, torch.float32),
                           PAGE, num_pages=num_pages)
        self.alloc = PageAllocator(num_pages)
        self.graphs = make_decode_graphs(graphs_setting, model, self.pool, self.backend,
                                         self.alloc, max_batch, c.max_position_embeddings,
                                         capture=capture)
        self.pages: list[list[int]] = []
        self.lens: list[int] = []
        self.tokens: list[list[int]] = []

    def _cover(self, b: int, n: int) -> None:
        need = -(-(self.lens[b] + n) // PAGE) - len(self.pages[b])
        self.pages[b] += self.alloc.allocate(max(0, need))

    def prefill(self, prompts: list[list[int]]) -> None:
        for p in prompts:
            self.pages.append([])
            self.lens.append(0)
            self.tokens.append([])
            self._cover(len(self.pages) - 1, len(p))
            batch = build_forward_batch([p], [0], [self.pages[-1]], PAGE)
            logits = self.model(batch, self.pool, self.backend)
            self.lens[-1] = len(p)
            self.tokens[-1].append(int(logits[0].argmax()))

    def decode(self, rows: list[int]) -> torch.Tensor:
        for b in rows:
            self._cover(b, 1)
        batch = build_forward_batch([[self.tokens[b][-1]] for b in rows],
                                    [self.lens[b] for b in rows], [self.pages[b] for b in rows],
                                    PAGE)
        logits = self.graphs.run(batch) if self.graphs is not None else None
        if logits is None:
            logits = self.model(batch, self.pool, self.backend)
        for i, b in enumerate(rows):
            self.lens[b] += 1
            self.tokens[b].append(int(logits[i].argmax()))
        return logits

    def sequence_kv(self, b: int) -> torch.Tensor:
        """K and V of sequence ``b``'s tokens in order: [L, 2, lens[b], Hkv, D]."""
        kv = self.pool.buffer[:, :, torch.tensor(self.pages[b])]       # [L, 2, n, S, Hkv, D]
        return kv.flatten(2, 3)[:, :, :self.lens[b]]

    def real_pages(self) -> list[int]:
        return sorted(p for pages in self.pages for p in pages)


PROMPTS = [[5, 9, 13], [2, 4, 6, 8, 10, 12, 14], [1], [30, 31, 32, 33, 34], [7, 7, 7, 7, 7, 7],
           [40, 41], [50, 52, 54, 56, 58, 60, 62, 64, 66], [3, 1, 4, 1, 5]]
# decode steps over changing subsets: sizes 3 (bucket 4), 5 and 8 (bucket 8), 1, 2
SCHEDULE = [[0, 1, 2]] * 3 + [[0, 1, 2, 3, 4]] * 3 + [list(range(8))] * 4 + [[6]] * 2 + [[5, 7]] * 2


def run_schedule(dec: Decoder, schedule=SCHEDULE) -> list[torch.Tensor]:
    dec.prefill(PROMPTS)
    return [dec.decode(rows) for rows in schedule]
