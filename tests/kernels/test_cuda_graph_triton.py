"""The Triton backend replayed as a CUDA graph would replay it (under the interpreter on CPU):
the launches see the host values of the capture (every sequence at the worst-case length),
while the device metadata changes each step. Greedy tokens and logits equal eager decoding."""

from __future__ import annotations

import torch

from tests.support.graph_decoding import Decoder, run_schedule, tiny_model
from agentlang.runtime.attention.triton_backend import TritonAttentionBackend
from agentlang.runtime.execution.cuda_graph import RerunCapture, StaticDecodeBatch

SCHEDULE = [[0, 1, 2]] * 2 + [[0, 1, 2, 3, 4]] * 2 + [[4]]


def test_triton_decode_with_capture_time_host_values_equals_eager(monkeypatch):
    load = StaticDecodeBatch.load

    def frozen_host_load(self, batch, view):   # a graph keeps the capture's host values
        load(self, batch, view)
        worst = self.max_pages * self.page_size
        view.seq_lens_list = [worst] * view.batch_size
        view.prefix_lens_list = [worst - 1] * view.batch_size

    monkeypatch.setattr(StaticDecodeBatch, "load", frozen_host_load)
    model = tiny_model(4)
    eager = Decoder(model, False, None, backend=TritonAttentionBackend())
    graph = Decoder(model, True, RerunCapture(),
                    backend=TritonAttentionBackend())
    assert graph.backend.graph_safe and graph.graphs.static.max_pages == 16
    want, got = run_schedule(eager, SCHEDULE), run_schedule(graph, SCHEDULE)
    assert graph.graphs.replays == len(SCHEDULE)
    assert graph.tokens == eager.tokens
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
