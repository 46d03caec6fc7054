"""The row cost measured on the machine (agentlang.runtime.speculative.calibrate): a value in
range from the model's own steps, on pages it gives back, none taken from requests or the
cache; nothing measured when the pool is short; the engine measures it at the first draft
decision and keeps it, and a given value is used as given."""

from __future__ import annotations

import pytest

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.engine.config import EngineConfig
from agentlang.runtime.scheduler.live_programs import busy_requests
from agentlang.runtime.speculative.calibrate import MIN_COST, measure_row_cost
from agentlang.runtime.speculative.policy import ROW_COST
from agentlang.runtime.weights.model_loader import resolve_model

pytestmark = pytest.mark.slow

COPY = ("Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps "
        "over the lazy dog, the quick brown fox")


@pytest.fixture(scope="module")
def eng():
    return Engine(resolve_model("default", "auto").path, weights="auto", kv_budget_mb=64)


def test_measured_on_pages_of_its_own(eng):
    eng.generate(COPY, SamplingParams(max_tokens=4, temperature=0))   # something cached
    free, cached = eng.allocator.num_free, eng.cache.cached_pages
    c = measure_row_cost(eng.model, eng.pool, eng.allocator, eng.backend, eng.max_context)
    assert MIN_COST <= c <= 1
    assert eng.allocator.num_free == free and eng.cache.cached_pages == cached
    eng.allocator.check_integrity()


def test_nothing_measured_when_the_pool_is_short(eng):
    held = eng.allocator.allocate(eng.allocator.num_free - 3)
    try:
        assert measure_row_cost(eng.model, eng.pool, eng.allocator, eng.backend,
                                eng.max_context) is None
    finally:
        eng.allocator.decref(held)


def test_the_engine_measures_at_the_first_draft_and_keeps_it(eng):
    assert eng.metrics()["spec_row_cost"] == ROW_COST          # no draft decided yet
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, speculative=True)
    off = eng.generate(COPY, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    on = eng.generate(COPY, params)
    assert on.outputs[0].token_ids == off.outputs[0].token_ids
    assert on.meta["spec_draft_tokens"] > 0
    c = eng.metrics()["spec_row_cost"]
    assert MIN_COST <= c <= 1 and c != ROW_COST                # measured
    eng.generate(COPY, params)
    assert eng.metrics()["spec_row_cost"] == c                 # kept, not measured again


def test_a_given_row_cost_is_used_and_the_live_bound_keeps_its_default(tmp_path):
    cfg = EngineConfig(speculative_row_cost=0.2)
    cfg.validate()
    assert cfg.scheduler_config(64).busy_requests == busy_requests(0.2)
    auto = EngineConfig()
    auto.validate()
    assert auto.speculative_row_cost is None
    assert auto.scheduler_config(64).busy_requests == busy_requests(ROW_COST)
    for bad in (0, 1.5, "0.2", True):
        with pytest.raises(ValueError, match="speculative_row_cost"):
            EngineConfig(speculative_row_cost=bad).validate()
