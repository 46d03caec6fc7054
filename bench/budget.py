"""Budget-aware completion (issue 16): validity at tight budgets with the feature on and off,
and the per-step cost of the shortest-completion search.

(a) validity: the 20-schema set, three regexes and a Lark grammar, each at budgets drawn from
    [minimum, minimum + 40] × temperature {0, 1.0, 1.5}, both grammar backends, side by side
    with ``complete_within_budget`` off (what an anchor's user sees: truncated output);
(b) cost: wall time spent in :meth:`BudgetGuard.settle` per decode step, as a share of step
    time, for a batch of 16 JSON-constrained requests.

    python bench/budget.py [--generations N] [--backends xgrammar,outlines]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from data.schemas import CALC, SCHEMAS  # noqa: E402
from data.validity import is_valid  # noqa: E402
from runtime import Engine, SamplingParams  # noqa: E402
from runtime.grammar.budget import BudgetGuard, BudgetTooSmall  # noqa: E402

REGEXES = [r"\(\d{3}\) \d{3}-\d{4}", r"[a-z]+@[a-z]+\.(com|org)",
           r"(yes|no|maybe), because [a-z ]+\."]
TEMPERATURES = (0.0, 1.0, 1.5)


def cases() -> list[tuple[str, dict]]:
    out = [(n, {"json_schema": s}) for n, s, _ in SCHEMAS]
    out += [(f"regex{i}", {"regex": r}) for i, r in enumerate(REGEXES)]
    return out + [("calc", {"grammar": CALC})]


def minimum(eng: Engine, kw: dict) -> int | None:
    """The shortest valid output in tokens (None: the backend refuses the constraint)."""
    try:
        eng.generate("x", SamplingParams(max_tokens=1, **kw))
    except BudgetTooSmall as e:
        return e.minimum
    except ValueError:
        return None
    return 1


def validity(eng: Engine, generations: int, seed: int) -> dict:
    rng = random.Random(seed)
    runnable, refused = [], []
    for name, kw in cases():
        low = minimum(eng, kw)
        (refused if low is None else runnable).append((name, kw, low))
    jobs = []
    while len(jobs) < generations:
        for name, kw, low in runnable:
            for t in TEMPERATURES:
                jobs.append((name, kw, low + rng.randint(0, 40), t, rng.getrandbits(31)))
    jobs = jobs[:generations]
    result = {"generations": len(jobs), "refused": [n for n, _, _ in refused]}
    for flag in (True, False):
        prompts = [[{"role": "user", "content": f"Write a long, detailed {n} as requested."}]
                   for n, *_ in jobs]
        params = [SamplingParams(max_tokens=b, temperature=t, seed=s, complete_within_budget=flag,
                                 **kw) for _, kw, b, t, s in jobs]
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params)
        wall = time.perf_counter() - t0
        ok = [is_valid(kw, o.text) for (_, kw, *_), o in zip(jobs, outs)]
        bad = sorted({n for (n, *_), good in zip(jobs, ok) if not good})
        result["on" if flag else "off"] = {
            "valid": sum(ok), "valid_pct": 100 * sum(ok) / len(ok), "wall_s": wall,
            "forced_tokens": sum(o.outputs[0].forced_completion_tokens for o in outs),
            "invalid_cases": bad}
    return result


def settle_cost(eng: Engine, batch: int = 16) -> dict:
    """Share of step time spent in BudgetGuard.settle (search + verification)."""
    schema = SCHEMAS[1][1]
    prompts = [[{"role": "user", "content": f"Invent address {i} as JSON."}] for i in range(batch)]
    sp = SamplingParams(max_tokens=80, temperature=1.0, seed=5, json_schema=schema)
    eng.generate(prompts[:1], sp)                      # compile + warm up
    acc = [0.0]
    orig = BudgetGuard.settle

    def timed(self, *a, **k):
        t = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            acc[0] += time.perf_counter() - t

    BudgetGuard.settle = timed
    try:
        before = eng.metrics()["forward_passes"]
        t = time.perf_counter()
        eng.generate(prompts, sp)
        wall = time.perf_counter() - t
    finally:
        BudgetGuard.settle = orig
    steps = eng.metrics()["forward_passes"] - before
    return {"batch": batch, "steps": steps, "step_ms": 1e3 * wall / steps,
            "settle_ms_per_step": 1e3 * acc[0] / steps, "settle_pct": 100 * acc[0] / wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--generations", type=int, default=2000, help="per backend")
    ap.add_argument("--backends", default="xgrammar,outlines")
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    report = {}
    for backend in args.backends.split(","):
        kw = {"grammar_backend": backend, "page_size": 16, "kv_budget_mb": 512}
        if args.device:
            kw["device"] = args.device
        eng = Engine("default", **kw)
        report[backend] = {"validity": validity(eng, args.generations, seed=16),
                           "cost": settle_cost(eng)}
        print(json.dumps({backend: report[backend]}, indent=1), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
