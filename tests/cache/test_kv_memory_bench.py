"""bench/kv_memory.py on a short trace: paged KV wastes little and fits many more requests."""

import importlib.util
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).parents[2] / "bench" / "kv_memory.py"
    spec = importlib.util.spec_from_file_location("kv_memory_bench", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod     # dataclasses look their module up while the body runs
    spec.loader.exec_module(mod)
    return mod


def test_paged_beats_contiguous_reservation(bench):
    res = bench.run(bench.Workload(requests=300, seed=3), page_sizes=(16,))
    assert res["paged_page_size"] == 16
    assert res["paged_waste_pct"] <= 4.0
    assert res["contiguous_waste_pct"] >= 50.0
    assert res["concurrency_ratio"] >= 3.0
    contiguous = res["results"][0]
    assert contiguous["policy"] == "contiguous" and contiguous["max_concurrent"] == 16


def test_trace_respects_bounds(bench):
    w = bench.Workload(requests=500, seed=1)
    trace = bench.make_trace(w)
    assert len(trace) == 500 and trace == bench.make_trace(w)
    assert all(50 <= p <= 2000 and 20 <= o <= 500 for p, o in trace)
    assert len({p for p, _ in trace}) > 100        # a real spread, not a constant
