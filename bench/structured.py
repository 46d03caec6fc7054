"""Structured generation: mask overhead, jump-forward savings, and validity over 20 schemas.

(a) per-token grammar overhead (mask fill + apply + token accept) as % of step time, for a
    batch of 1 and of 16 JSON-constrained requests;
(b) forward passes and wall time, jump-forward off vs on, for a key-heavy schema (8 fixed keys);
(c) validity: 20 JSON schemas × 3 prompts, both grammar backends — share of outputs that parse
    and validate with ``jsonschema`` (features a backend cannot enforce are refused with an
    error and reported as "unsupported", never silently relaxed);
(d) budget-aware completion (issue 16): the grid of ``tests/data/budget_grid.py`` (20 schemas,
    3 regexes, a Lark grammar × max_tokens in [minimum, minimum + 40] × temperature {0, 1, 1.5}),
    ``--budget-generations`` per backend, the same jobs with ``complete_within_budget`` on and
    off (off: the text cut at ``max_tokens``, what an SGLang/vLLM/Outlines user sees);
(e) the per-step cost of the budget guard (shortest-completion search + verification in
    :meth:`BudgetGuard.settle`) as % of step time, batch 16.

    python bench/structured.py [--quick] [--budget-generations N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path

import jsonschema
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from bench.output import results_path, write_results  # noqa: E402
from data import budget_grid  # noqa: E402
from data.schemas import KEY_HEAVY, SCHEMAS  # noqa: E402
from agentlang.runtime import Engine, SamplingParams  # noqa: E402
import agentlang.runtime.grammar.mask as mask_mod  # noqa: E402
from agentlang.runtime.core.errors import ErrorCode  # noqa: E402
from agentlang.runtime.grammar.budget import BudgetGuard  # noqa: E402
from agentlang.runtime.grammar.xgrammar_backend import XGrammarMatcher  # noqa: E402

PROMPTS = ["Give an example JSON value for '{n}'.",
           "Produce realistic data matching the '{n}' format.",
           "Return one '{n}' record as JSON."]


@contextlib.contextmanager
def settle_timer(acc: list[float]):
    """Accumulate wall time spent in :meth:`BudgetGuard.settle`."""
    orig = BudgetGuard.settle

    def timed(self, *a, **k):
        t = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            acc[0] += time.perf_counter() - t

    BudgetGuard.settle = timed
    try:
        yield
    finally:
        BudgetGuard.settle = orig


@contextlib.contextmanager
def grammar_timer(acc: list[float]):
    """Accumulate wall time spent in mask filling/applying and in token acceptance."""
    orig_mask, orig_accept = mask_mod.apply_grammar_masks, XGrammarMatcher.accept_token

    def timed_mask(*a, **k):
        t = time.perf_counter()
        try:
            return orig_mask(*a, **k)
        finally:
            acc[0] += time.perf_counter() - t

    def timed_accept(self, tok):
        t = time.perf_counter()
        try:
            return orig_accept(self, tok)
        finally:
            acc[0] += time.perf_counter() - t

    mask_mod.apply_grammar_masks, XGrammarMatcher.accept_token = timed_mask, timed_accept
    try:
        yield
    finally:
        mask_mod.apply_grammar_masks, XGrammarMatcher.accept_token = orig_mask, orig_accept


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def timed_generate(eng: Engine, prompts: list, sp: SamplingParams,
                   timer) -> tuple[int, float, float]:
    """Warm up (compile) on one prompt, then one batched ``generate`` of ``prompts`` under
    ``timer``: (forward passes, wall seconds, seconds the timer accumulated)."""
    eng.generate(prompts[:1], sp)
    acc = [0.0]
    before = eng.metrics()["forward_passes"]
    t = time.perf_counter()
    with timer(acc):
        eng.generate(prompts, sp)
    wall = time.perf_counter() - t
    return eng.metrics()["forward_passes"] - before, wall, acc[0]


def mask_overhead(eng: Engine, batch: int) -> dict:
    prompts = [chat(f"Invent person number {i} and describe them as JSON.") for i in range(batch)]
    sp = SamplingParams(max_tokens=64, temperature=0, json_schema=KEY_HEAVY, jump_forward=False)
    steps, wall, spent = timed_generate(eng, prompts, sp, grammar_timer)
    return {"batch": batch, "steps": steps, "step_ms": 1e3 * wall / steps,
            "grammar_ms_per_step": 1e3 * spent / steps, "overhead_pct": 100 * spent / wall}


def jump_forward(eng: Engine) -> dict:
    res = {}
    texts = []
    for jf in (False, True):
        before = eng.metrics()["forward_passes"]
        t = time.perf_counter()
        out = eng.generate(chat("Invent a person and describe them as JSON."),
                           SamplingParams(max_tokens=160, temperature=0, json_schema=KEY_HEAVY,
                                          jump_forward=jf))
        res["on" if jf else "off"] = {"forward_passes": eng.metrics()["forward_passes"] - before,
                                      "wall_s": time.perf_counter() - t}
        texts.append(out.text)
    res["identical_text"] = texts[0] == texts[1]
    res["passes_saved_pct"] = 100 * (1 - res["on"]["forward_passes"] / res["off"]["forward_passes"])
    return res


def validity(eng: Engine, n_prompts: int) -> dict:
    ok = bad = unsupported = 0
    failures = []
    for name, schema, _ in SCHEMAS:
        outs = eng.generate([chat(p.format(n=name)) for p in PROMPTS[:n_prompts]],
                            SamplingParams(max_tokens=200, temperature=0, json_schema=schema))
        for out in outs:
            if out.error is not None and out.error.code is ErrorCode.INVALID_CONSTRAINT:
                unsupported += 1
                continue
            try:
                jsonschema.validate(json.loads(out.text), schema)
                ok += 1
            except (ValueError, jsonschema.ValidationError) as e:
                bad += 1
                failures.append({"schema": name, "text": out.text, "error": str(e)[:200]})
    total = ok + bad
    return {"valid": ok, "invalid": bad, "unsupported": unsupported,
            "valid_pct": 100 * ok / total if total else 0.0, "failures": failures}


def _summary(rs: list, wall: float) -> dict:
    valid = sum(r.valid for r in rs)
    return {"generations": len(rs), "valid": valid, "valid_pct": 100 * valid / len(rs),
            "wall_s": wall, "errors": sum(r.error is not None for r in rs),
            "forced_tokens": sum(r.forced for r in rs),
            "outputs_with_forced_tokens": sum(r.forced > 0 for r in rs),
            "finish_length": sum(r.finish_reason == "length" for r in rs),
            "invalid_by_case": {n: sum(1 for r in rs if r.job.name == n and not r.valid)
                                for n in sorted({r.job.name for r in rs if not r.valid})},
            "invalid_examples": [{"case": r.job.name, "max_tokens": r.job.max_tokens,
                                  "text": r.text[-120:]} for r in rs if not r.valid][:5]}


def budget_validity(eng: Engine, generations: int, off_every: int, seed: int = 16) -> dict:
    """(d): ``generations`` seeded jobs with the guard on; a seeded random 1/``off_every`` of
    the same jobs again with the guard off, reported next to the guard-on results of that
    subset."""
    low, refused = budget_grid.minimums(eng, budget_grid.cases())
    jobs = budget_grid.draw_jobs(low, generations, seed)
    subset = sorted(random.Random(seed).sample(range(len(jobs)), len(jobs) // off_every))
    res: dict = {"minimums": low, "refused": refused}
    runs = {}
    for flag, part in ((True, jobs), (False, [jobs[i] for i in subset])):
        with tqdm(total=len(part), desc=f"  guard {'on' if flag else 'off'}") as bar:
            t = time.perf_counter()
            runs[flag] = budget_grid.run_jobs(eng, part, flag, chunk=128, progress=bar.update)
            wall = time.perf_counter() - t
        res["on" if flag else "off"] = _summary(runs[flag], wall)
    res["on_same_jobs_as_off"] = _summary([runs[True][i] for i in subset], 0.0)
    return res


def settle_cost(eng: Engine, batch: int = 16) -> dict:
    """(e): share of step time spent in BudgetGuard.settle at ``batch`` JSON requests (three
    free strings: the plan changes at most steps, so most steps search or look up)."""
    schema = SCHEMAS[1][1]
    prompts = [chat(f"Invent address {i} as JSON.") for i in range(batch)]
    sp = SamplingParams(max_tokens=80, temperature=1.0, seed=5, json_schema=schema)
    steps, wall, spent = timed_generate(eng, prompts, sp, settle_timer)
    return {"batch": batch, "steps": steps, "step_ms": 1e3 * wall / steps,
            "settle_ms_per_step": 1e3 * spent / steps, "settle_pct": 100 * spent / wall}


def structured_sections(engines: dict[str, Engine], results: dict, quick: bool) -> None:
    """(a)–(c) into ``results``."""
    eng = engines["xgrammar"]
    results["mask_overhead"] = [mask_overhead(eng, b) for b in ((1, 4) if quick else (1, 16))]
    for r in results["mask_overhead"]:
        print(f"(a) batch {r['batch']:2d}: step {r['step_ms']:.1f} ms, grammar "
              f"{r['grammar_ms_per_step']:.2f} ms/step = {r['overhead_pct']:.2f}%", flush=True)
    jf = results["jump_forward"] = jump_forward(eng)
    print(f"(b) jump-forward: passes {jf['off']['forward_passes']} → {jf['on']['forward_passes']} "
          f"({jf['passes_saved_pct']:.0f}% fewer), wall {jf['off']['wall_s']:.1f}s → "
          f"{jf['on']['wall_s']:.1f}s, identical text: {jf['identical_text']}", flush=True)
    results["validity"] = {}
    for backend, e in engines.items():
        v = results["validity"][backend] = validity(e, 1 if quick else 3)
        print(f"(c) {backend}: {v['valid']}/{v['valid'] + v['invalid']} valid "
              f"({v['valid_pct']:.0f}%), {v['unsupported']} refused as unsupported", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 prompt per schema, batch 4")
    ap.add_argument("--out", help="JSON output (default: bench/results/structured.json; "
                    "a --quick run: a temporary directory)")
    ap.add_argument("--budget-generations", type=int, default=1000,
                    help="(d) generations per backend with the guard on (--quick: 48)")
    ap.add_argument("--off-every", type=int, default=4,
                    help="(d) run every k-th job again with the guard off (default 4)")
    ap.add_argument("--only-budget", action="store_true",
                    help="run (d) and (e) only, updating those keys of the existing results")
    args = ap.parse_args()
    path = results_path("structured", args.out, args.quick)
    results = {"machine": "2-core x86_64 CPU, 24 GiB", "model": "SmolLM2-135M-Instruct",
               "dtype": "float32"}
    if args.only_budget and path.exists():
        results = json.loads(path.read_text())
    engines = {"xgrammar": Engine(page_size=16, kv_budget_mb=512, grammar_backend="xgrammar"),
               "outlines": Engine(page_size=16, kv_budget_mb=512, grammar_backend="outlines")}
    if not args.only_budget:
        structured_sections(engines, results, args.quick)
    results["budget"], results["budget_cost"] = {}, {}
    n = 48 if args.quick else args.budget_generations
    for backend, e in engines.items():
        b = results["budget"][backend] = budget_validity(e, n, args.off_every)
        same = b["on_same_jobs_as_off"]
        print(f"(d) {backend}: guard on {b['on']['valid']}/{b['on']['generations']} valid "
              f"({b['on']['valid_pct']:.1f}%); same {b['off']['generations']} jobs: on "
              f"{same['valid_pct']:.1f}% vs off {b['off']['valid_pct']:.1f}%; "
              f"refused: {sorted(b['refused'])}", flush=True)
        c = results["budget_cost"][backend] = settle_cost(e)
        print(f"(e) {backend}: batch {c['batch']}: step {c['step_ms']:.1f} ms, guard "
              f"{c['settle_ms_per_step']:.2f} ms/step = {c['settle_pct']:.2f}%", flush=True)
        results["budget_loadavg_1_5_15"] = os.getloadavg()
        out = write_results("structured", results, path, args.quick)   # after each backend
        print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
