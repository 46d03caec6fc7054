"""The engine's CUDA-graph switch: off on CPU by default, refused on CPU when forced, and (with
``RerunCapture`` standing in for CUDA capture) decode through the whole engine from graphs gives
the eager engine's greedy outputs, with the padding page the only page held afterwards."""

from __future__ import annotations

import functools

import pytest

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.engine import engine as engine_module
from agentlang.runtime.execution.cuda_graph import RerunCapture, make_decode_graphs

PROMPTS = ["The quick brown fox jumps over the lazy dog because", "1 2 3",
           "Write a haiku about paged attention kernels.", "def fibonacci(n):", "Hello"]


def test_switch_off_on_cpu_and_refused_when_forced(tiny_llama_dir):
    eng = Engine(model=str(tiny_llama_dir), device="cpu", num_pages=64)
    assert eng.config.cuda_graph is None and eng.runner.graphs is None
    eng.shutdown()
    with pytest.raises(ValueError, match="cuda_graph=True needs device 'cuda'"):
        Engine(model=str(tiny_llama_dir), device="cpu", num_pages=64, cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph must be True, False or None"):
        Engine(model=str(tiny_llama_dir), device="cpu", num_pages=64, cuda_graph="yes")


def test_engine_decodes_from_graphs_like_eager(tiny_llama_dir, monkeypatch):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    eager = Engine(model=str(tiny_llama_dir), device="cpu", num_pages=64, max_running=4)
    want = [o.token_ids for o in eager.generate(PROMPTS, params)]
    eager.shutdown()
    monkeypatch.setattr(engine_module, "make_decode_graphs",
                        functools.partial(make_decode_graphs, capture=RerunCapture()))
    eng = Engine(model=str(tiny_llama_dir), device="cpu", num_pages=64, max_running=4,
                 cuda_graph=True)
    graphs = eng.runner.graphs
    assert graphs is not None and graphs.buckets == (1, 2, 4)
    got = [o.token_ids for o in eng.generate(PROMPTS, params)]
    assert got == want
    assert graphs.replays > 0 and graphs.disabled is None
    eng.flush_cache()
    assert eng.allocator.num_free == eng.allocator.num_pages - 1     # the padding page
    assert eng.allocator.refcount(graphs.static.pad_page) == 1
    eng.shutdown()
