"""Engine-level check: greedy outputs with the ``triton`` attention backend (under the
interpreter on CPU) equal those with the ``torch`` backend, for a tiny random-weight Llama."""

from __future__ import annotations

import pytest

from agentlang.runtime import Engine, SamplingParams


@pytest.mark.slow
def test_greedy_outputs_triton_equal_torch(tiny_llama_dir):
    # page_size 16: prompts span pages, end mid-page; page sizes 1/16 vs torch are covered by
    # test_triton_backend.py (each interpreted launch costs ~0.1 s, so one engine config here)
    prompts = [
        "The quick brown fox jumps over the lazy dog because it wanted to see what was on the "
        "other side of the hill, and the dog",
        "1 2 3",
    ]
    shared = prompts[0] + " did not care at all"  # prefix-cache hit: extend over cached pages
    params = SamplingParams(max_tokens=8, temperature=0)
    results = {}
    for backend in ("torch", "triton"):
        eng = Engine(model=str(tiny_llama_dir), attention_backend=backend, device="cpu",
                     page_size=16, num_pages=64)
        assert eng.backend.name == backend
        outs = eng.generate(prompts, params)
        outs.append(eng.generate(shared, params))
        assert outs[-1].meta["cached_tokens"] >= 16
        results[backend] = [o.token_ids for o in outs]
    assert all(len(t) > 0 for t in results["torch"])
    assert results["triton"] == results["torch"]
