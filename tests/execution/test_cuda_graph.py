"""CUDA-graph decode logic on CPU with a fake capture: bucket choice, padding rows, static-buffer
reuse, eager fallback (prefill, above the largest bucket, capture failure) and greedy tokens
and KV contents identical to eager decoding. The fake "graph" re-runs the captured callable on
the static buffers, so the padding and static-buffer logic runs for real."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.support.graph_decoding import (PAGE, PROMPTS, SCHEDULE, Decoder, FailingCapture,
                            run_schedule, tiny_model)
from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
from agentlang.runtime.execution.cuda_graph import (BUCKETS, DecodeGraphs, RerunCapture, StaticDecodeBatch,
                                bucket_for, choose_buckets, make_decode_graphs)
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.cache.page_allocator import PageAllocator

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
    fake = RerunCapture()
    graph = Decoder(model, True, fake)
    want, got = run_schedule(eager), run_schedule(graph)
    assert graph.tokens == eager.tokens
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    g = graph.graphs
    assert g.replays == len(SCHEDULE) and g.eager_fallbacks == 0 and g.disabled is None
    assert sorted(g.graphs) == [1, 2, 4, 8] and fake.captures == 4   # one capture per bucket
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
    dec = Decoder(model, True, RerunCapture())
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
    small = Decoder(model, True, RerunCapture(), max_batch=4)   # buckets 1, 2, 4
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
    graphs = make_decode_graphs(True, model, pool, torch_backend, alloc, 8, 64, RerunCapture())
    assert isinstance(graphs, DecodeGraphs) and alloc.num_free == 7
    assert graphs.static.max_pages == 32 // PAGE     # min(max context 64, pool capacity 32) / S
