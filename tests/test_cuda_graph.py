"""CUDA-graph decode logic on CPU with a fake capture: bucket choice, padding rows, static-buffer
reuse, eager fallback (prefill, above the largest bucket, capture failure) and greedy tokens
and KV contents identical to eager decoding. The fake "graph" re-runs the captured callable on
the static buffers, so the padding and static-buffer logic runs for real."""

from __future__ import annotations

import warnings

import pytest
import torch

from runtime.attention.torch_backend import TorchAttentionBackend
from runtime.cuda_graph import (BUCKETS, DecodeGraphs, StaticDecodeBatch, bucket_for,
                                choose_buckets, make_decode_graphs)
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

    def __init__(self, model, graphs_setting, capture, max_batch=8, num_pages=64):
        c = model.config
        self.model, self.backend = model, TorchAttentionBackend()
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


def test_bucket_choice():
    assert BUCKETS == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert [bucket_for(n, BUCKETS) for n in (1, 2, 3, 5, 8, 9, 129, 256)] == \
        [1, 2, 4, 8, 8, 16, 256, 256]
    assert bucket_for(257, BUCKETS) is None
    assert choose_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert choose_buckets(100) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert choose_buckets(1) == (1,)
    assert choose_buckets(10_000) == BUCKETS
    with pytest.raises(ValueError, match="max_batch"):
        choose_buckets(0)


def test_padding_rows_and_static_views():
    static = StaticDecodeBatch(8, max_pages=5, page_size=PAGE, pad_page=11, device=torch.device("cpu"))
    batch = build_forward_batch([[3], [4], [5]], [6, 0, 9], [[1, 2], [7], [8, 9, 10]], PAGE)
    view = static.view(4)
    assert view.seq_lens_list == [5 * PAGE] * 4          # worst case while capturing
    ptrs = [t.data_ptr() for t in (view.input_ids, view.page_table, view.slot_mapping)]
    static.load(batch, view)
    assert view.input_ids.tolist() == [3, 4, 5, 0]
    assert view.positions.tolist() == [6, 0, 9, 0]
    assert view.seq_lens.tolist() == [7, 1, 10, 1]
    assert view.prefix_lens.tolist() == [6, 0, 9, 0]
    assert view.q_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert view.logits_indices.tolist() == [0, 1, 2, 3]
    assert view.slot_mapping.tolist() == batch.slot_mapping.tolist() + [11 * PAGE]
    assert view.page_table.tolist() == [[1, 2, 0, 0, 0], [7, 0, 0, 0, 0], [8, 9, 10, 0, 0],
                                        [11, 0, 0, 0, 0]]
    assert view.seq_lens_list == [7, 1, 10, 1] and view.prefix_lens_list == [6, 0, 9, 0]
    # a smaller batch later: stale rows become padding, the buffers are the same memory
    static.load(build_forward_batch([[1]], [0], [[3]], PAGE), view)
    assert view.page_table.tolist()[1:] == [[11, 0, 0, 0, 0]] * 3
    assert view.seq_lens.tolist() == [1, 1, 1, 1]
    assert [t.data_ptr() for t in (view.input_ids, view.page_table, view.slot_mapping)] == ptrs


def test_replay_matches_eager_tokens_logits_and_kv():
    model = tiny_model()
    eager = Decoder(model, False, None)
    assert eager.graphs is None
    fake = FakeCapture()
    graph = Decoder(model, True, fake)
    want, got = run_schedule(eager), run_schedule(graph)
    assert graph.tokens == eager.tokens
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    g = graph.graphs
    assert g.replays == len(SCHEDULE) and g.eager_fallbacks == 0 and g.disabled is None
    assert sorted(g.graphs) == [1, 2, 4, 8] and fake.captured == 4   # one capture per bucket
    # padding rows wrote only the padding page: every real page holds the eager K/V
    pad = g.static.pad_page
    assert pad not in graph.real_pages()
    for b in range(len(PROMPTS)):
        assert graph.lens[b] == eager.lens[b]
        torch.testing.assert_close(graph.sequence_kv(b), eager.sequence_kv(b), atol=1e-5,
                                   rtol=1e-5)
    assert graph.alloc.refcount(pad) == 1                  # held by the graphs, nobody else


def test_static_output_reused_across_replays():
    model = tiny_model(1)
    dec = Decoder(model, True, FakeCapture())
    dec.prefill(PROMPTS[:3])
    first = dec.decode([0, 1, 2])
    _, out, view = dec.graphs.graphs[4]
    ptr = out.data_ptr()
    second = dec.decode([0, 1, 2])
    assert dec.graphs.graphs[4][1].data_ptr() == ptr and dec.graphs.graphs[4][2] is view
    assert first.data_ptr() != ptr and second.data_ptr() != ptr   # callers get fresh tensors
    assert not torch.equal(first, second)                         # new step, new logits


def test_above_largest_bucket_and_prefill_run_eagerly():
    model = tiny_model(2)
    eager = Decoder(model, False, None)
    small = Decoder(model, True, FakeCapture(), max_batch=4)   # buckets 1, 2, 4
    assert small.graphs.buckets == (1, 2, 4)
    run_schedule(small)
    run_schedule(eager)
    assert small.tokens == eager.tokens
    # the 5- and 8-row steps (7 of them) ran eagerly, the rest replayed
    assert small.graphs.eager_fallbacks == 7 and small.graphs.replays == len(SCHEDULE) - 7
    assert sorted(small.graphs.graphs) == [1, 2, 4]
    prefill = build_forward_batch([[1, 2, 3]], [0], [[small.alloc.allocate(1)[0]]], PAGE)
    assert not prefill.is_decode and small.graphs.run(prefill) is None


def test_capture_failure_warns_once_and_runs_eagerly():
    model = tiny_model(3)
    eager = Decoder(model, False, None)
    failing = FailingCapture()
    broken = Decoder(model, True, failing)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_schedule(broken)
    run_schedule(eager)
    graph_warnings = [w for w in caught if "CUDA-graph decode disabled" in str(w.message)]
    assert len(graph_warnings) == 1 and graph_warnings[0].category is RuntimeWarning
    assert failing.calls == 1 and broken.graphs.disabled is not None
    assert broken.graphs.replays == 0 and broken.graphs.eager_fallbacks == len(SCHEDULE)
    assert broken.tokens == eager.tokens


def test_switch_defaults_and_bad_settings():
    model = tiny_model()
    c = model.config
    pool = KVPool(KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, torch.float32), PAGE,
                  num_pages=8)
    alloc = PageAllocator(8)
    torch_backend = TorchAttentionBackend()
    assert make_decode_graphs(None, model, pool, torch_backend, alloc, 8, 64) is None  # CPU: off
    assert make_decode_graphs(False, model, pool, torch_backend, alloc, 8, 64) is None
    with pytest.raises(ValueError, match="cuda_graph=True needs device 'cuda'"):
        make_decode_graphs(True, model, pool, torch_backend, alloc, 8, 64)
    with pytest.raises(ValueError, match="cuda_graph must be True, False or None"):
        make_decode_graphs("yes", model, pool, torch_backend, alloc, 8, 64)
    assert alloc.num_free == 8                                   # nothing held when off
    graphs = make_decode_graphs(True, model, pool, torch_backend, alloc, 8, 64, FakeCapture())
    assert isinstance(graphs, DecodeGraphs) and alloc.num_free == 7
    assert graphs.static.max_pages == 32 // PAGE     # min(max context 64, pool capacity 32) / S
