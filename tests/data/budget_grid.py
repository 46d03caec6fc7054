"""The budget-aware completion grid (issue 16), shared by the property test and the benchmark.

Cases: the 20-schema set, three regexes and a Lark grammar (``CALC``). Each generation draws its
``max_tokens`` from [minimum, minimum + ``SPAN``] (the minimum is what the engine itself refuses
below, :class:`BudgetTooSmall`), a temperature from ``TEMPERATURES`` and a seed, all from one
seeded ``random.Random``. A case a backend refuses (its error reported on the output at submit)
is listed with that error and generates nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import NamedTuple

from data.schemas import CALC, SCHEMAS
from data.validity import is_valid

REGEXES = [r"\(\d{3}\) \d{3}-\d{4}", r"[a-z]+@[a-z]+\.(com|org)",
           r"(yes|no|maybe), because [a-z ]+\."]
TEMPERATURES = (0.0, 1.0, 1.5)
SPAN = 40


def cases() -> list[tuple[str, dict]]:
    """``(name, constraint)``: the constraint is the SamplingParams keyword and its value."""
    out = [(n, {"json_schema": s}) for n, s, _ in SCHEMAS]
    out += [(f"regex{i}", {"regex": r}) for i, r in enumerate(REGEXES)]
    return out + [("calc", {"grammar": CALC})]


class Job(NamedTuple):
    name: str
    constraint: dict
    max_tokens: int
    temperature: float
    seed: int


class Result(NamedTuple):
    job: Job
    text: str
    valid: bool
    forced: int            # forced_completion_tokens
    finish_reason: str | None
    error: str | None


def minimums(eng, names: Iterable[tuple[str, dict]]) -> tuple[dict[str, int], dict[str, str]]:
    """Per case: the smallest accepted ``max_tokens`` (``{name: minimum}``), and the cases the
    engine's backend refuses (``{name: error}``)."""
    from agentlang.runtime import SamplingParams
    from agentlang.runtime.core.errors import ErrorCode
    from agentlang.runtime.grammar.budget import BudgetTooSmall

    low, refused = {}, {}
    for name, kw in names:
        try:
            out = eng.generate("x", SamplingParams(max_tokens=1, **kw))
        except BudgetTooSmall as e:
            low[name] = e.minimum
            continue
        if out.error is not None:
            assert out.error.code is ErrorCode.INVALID_CONSTRAINT, out.error
            refused[name] = str(out.error)
        else:
            low[name] = 1            # one token already makes a valid output
    return low, refused


def draw_jobs(low: dict[str, int], count: int, seed: int) -> list[Job]:
    """``count`` jobs cycling through the runnable cases × temperatures, budgets drawn in
    [minimum, minimum + SPAN]. Ordered so that the first ``len(low)`` jobs hold every case once
    (temperatures alternating) and every ``3 * len(low)`` the whole case × temperature grid."""
    rng = random.Random(seed)
    runnable = [(n, kw) for n, kw in cases() if n in low]
    grid = [(n, kw, TEMPERATURES[(i + k) % len(TEMPERATURES)])
            for k in range(len(TEMPERATURES)) for i, (n, kw) in enumerate(runnable)]
    jobs = []
    while len(jobs) < count:
        for n, kw, t in grid[:count - len(jobs)]:
            jobs.append(Job(n, kw, low[n] + rng.randint(0, SPAN), t, rng.getrandbits(31)))
    return jobs


def prompt(job: Job) -> list[dict]:
    return [{"role": "user", "content": f"Write a long, detailed {job.name} as requested."}]


def run_jobs(eng, jobs: list[Job], complete_within_budget: bool = True, chunk: int = 0,
             progress: Callable[[int], None] | None = None) -> list[Result]:
    """Generate every job (in ``chunk``-sized batched ``generate`` calls; 0: one call) and check
    each text with the oracle (``formats=True``: dates and uuids are format-checked)."""
    from agentlang.runtime import SamplingParams

    chunk = chunk or max(1, len(jobs))
    results: list[Result] = []
    for i in range(0, len(jobs), chunk):
        part = jobs[i:i + chunk]
        params = [SamplingParams(max_tokens=j.max_tokens, temperature=j.temperature, seed=j.seed,
                                 complete_within_budget=complete_within_budget, **j.constraint)
                  for j in part]
        for j, out in zip(part, eng.generate([prompt(j) for j in part], params)):
            c = out.outputs[0]
            assert len(c.token_ids) <= j.max_tokens, (j, len(c.token_ids))
            results.append(Result(j, c.text, is_valid(j.constraint, c.text),
                                  c.forced_completion_tokens, c.finish_reason,
                                  None if out.error is None else str(out.error)))
        if progress is not None:
            progress(len(part))
    return results
