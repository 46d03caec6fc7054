"""Property (issue 16): with budget-aware completion on, every constrained output is valid at any
budget from the minimum up. A seeded draw over the 20-schema set, three regexes and a Lark
grammar (``tests/data/budget_grid.py``): each case once per backend, ``max_tokens`` drawn from
[minimum, minimum + 40], temperature cycling through {0, 1.0, 1.5}, all in one batched
``generate`` call per backend. The full grid (≥ 2,000 generations, guard on vs off) is
``bench/structured.py`` (d)."""

import pytest

from data import budget_grid as G
from data.schemas import OUTLINES_UNSUPPORTED
from agentlang.runtime import Engine

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_every_output_is_valid_from_the_minimum_budget_up(model_path, backend):
    eng = Engine(model_path, page_size=16, kv_budget_mb=128, grammar_backend=backend)
    low, refused = G.minimums(eng, G.cases())
    if backend == "xgrammar":
        assert refused == {}, refused                 # xgrammar accepts the whole set
    else:                                             # outlines: number bounds, multipleOf, Lark
        assert set(refused) == OUTLINES_UNSUPPORTED | {"calc"}, refused
        assert all("not supported by the outlines backend" in e for e in refused.values())
    print(f"{backend} refuses: {refused}")
    jobs = G.draw_jobs(low, len(low), seed=16)
    assert {j.name for j in jobs} == set(low) and {j.temperature for j in jobs} == set(
        G.TEMPERATURES) and all(
        low[j.name] <= j.max_tokens <= low[j.name] + G.SPAN for j in jobs)
    results = G.run_jobs(eng, jobs)
    bad = [(r.job.name, r.job.max_tokens, r.job.temperature, r.text) for r in results
           if not r.valid or r.error is not None]
    assert not bad, bad
    assert sum(r.forced for r in results) > 0, "no output needed the guard: the draw is too easy"
    eng.flush_cache()
    assert eng.allocator.num_free == eng.allocator.num_pages     # no page leaks
