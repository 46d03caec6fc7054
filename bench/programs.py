"""agentlang programs on the local runtime vs the same programs run as naive sequential calls.

(a) tree of thought: 3 levels × 3 branches (3 + 9 + 27 thoughts) over a shared problem prompt;
(b) few-shot QA: 32 questions after one few-shot block, via ``run_batch``.

agentlang: forks and the batch run concurrently on one engine with the radix prefix cache, so
shared prefixes are prefilled once and branches decode together. Naive baseline: the same
programs, every generation a separate blocking call (one at a time) on an engine with the
prefix cache off — what a hand-written loop over a completion API does.

    python bench/programs.py [--quick] [--dtype float32]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.output import write_results  # noqa: E402
import agentlang as al  # noqa: E402
from agentlang.backends.base import Backend  # noqa: E402

PROBLEM = (
    "A farmer has a rectangular field 120 metres long and 80 metres wide. He wants to fence it, "
    "plant apple trees every 10 metres along the fence, and split the field into four equal "
    "plots with two straight paths. The fence costs 12 dollars per metre and each tree costs "
    "30 dollars. Think about the cheapest way to do all of this and explain the plan. "
) * 3

FEW_SHOT = "".join(
    f"Question: What is the capital of {c}?\nAnswer: {a}\n\n" for c, a in [
        ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
        ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Greece", "Athens"),
        ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"),
        ("Ireland", "Dublin"), ("Hungary", "Budapest"), ("Belgium", "Brussels"),
        ("Denmark", "Copenhagen"), ("Czechia", "Prague"), ("Egypt", "Cairo"), ("Japan", "Tokyo"),
        ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Canada", "Ottawa"),
    ])
COUNTRIES = ["Romania", "Bulgaria", "Croatia", "Serbia", "Slovakia", "Slovenia", "Estonia",
             "Latvia", "Lithuania", "Iceland", "Morocco", "Tunisia", "Nigeria", "Ghana",
             "Ethiopia", "India", "China", "Vietnam", "Thailand", "Indonesia", "Mexico", "Cuba",
             "Brazil", "Argentina", "Colombia", "Venezuela", "Australia", "Turkey", "Iran",
             "Iraq", "Israel", "Jordan"]


@al.function
def tree_of_thought(s, problem, depth=3, width=3, tokens=12):
    s += al.user(problem)
    s += al.assistant_begin()
    frontier = [s]
    for level in range(depth):
        nxt = []
        for node in frontier:
            forks = node.fork(width)
            forks += lambda i: f"\nIdea {level + 1}.{i + 1}:"
            forks += al.gen(f"idea{level}", max_tokens=tokens, stop="\n")
            nxt.extend(forks)
        frontier = nxt
    for node in frontier:
        node.sync()
    s += al.assistant_end()


@al.function
def few_shot(s, country, tokens=8):
    s += FEW_SHOT + f"Question: What is the capital of {country}?\nAnswer:"
    s += al.gen("answer", max_tokens=tokens, stop="\n")


class Sequential(Backend):
    """The naive baseline: one blocking call at a time, no prefix caching, no batching."""

    def __init__(self, inner: Backend):
        self.inner = inner
        self.capabilities = inner.capabilities
        self._lock = threading.Lock()

    def chat_template(self):
        return self.inner.chat_template()

    def generate(self, prompt, opts):
        with self._lock:
            return self.inner.generate(prompt, opts)

    def stream(self, prompt, opts):
        with self._lock:
            yield from self.inner.stream(prompt, opts)

    def score(self, prefix, continuations):
        with self._lock:
            return self.inner.score(prefix, continuations)

    def cache_prefix(self, text: str) -> Any:
        return None            # naive calls never pin or share anything

    def release_prefix(self, handle: Any) -> None:
        return None

    def metrics(self) -> dict:
        return self.inner.metrics()


def timed(fn) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def hit_rate(backend: Backend, before: dict) -> float:
    m = backend.metrics()
    q = m["prefix_cache_queried_tokens"] - before["prefix_cache_queried_tokens"]
    return (m["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]) / q if q else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="depth 2 and 8 questions")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--out", help="JSON output (default: bench/results/programs.json; "
                    "a --quick run: a temporary directory)")
    args = ap.parse_args()
    depth = 2 if args.quick else 3
    questions = COUNTRIES[: 8 if args.quick else 32]
    fast = al.Runtime(dtype=args.dtype, kv_budget_mb=1024)
    naive = Sequential(al.Runtime(dtype=args.dtype, kv_budget_mb=1024,
                                  enable_prefix_cache=False))
    results = {"machine": "2-core x86_64 CPU, 24 GiB", "model": "SmolLM2-135M-Instruct",
               "dtype": args.dtype, "runs": []}
    cases = [
        ("tree_of_thought", f"{depth} levels x 3 branches",
         lambda b: tree_of_thought.run(problem=PROBLEM, depth=depth, temperature=0, backend=b)),
        ("few_shot_batch", f"{len(questions)} questions, run_batch",
         lambda b: few_shot.run_batch([{"country": c} for c in questions], temperature=0,
                                      backend=b, progress_bar=True)),
    ]
    for name, workload, run in cases:
        run(fast)  # warm-up (also fills the cache once: it is flushed below)
        fast.engine.flush_cache()
        before = fast.metrics()
        t_fast, _ = timed(lambda: run(fast))
        rate = hit_rate(fast, before)
        t_naive, _ = timed(lambda: run(naive))
        ratio = t_naive / t_fast
        results["runs"].append({"program": name, "workload": workload, "agentlang_s": t_fast,
                                "naive_s": t_naive, "speedup": ratio, "cache_hit_rate": rate})
        print(f"{name:16s} {workload:26s} agentlang {t_fast:6.1f}s  naive {t_naive:6.1f}s  "
              f"→ {ratio:4.1f}×  (hit rate {rate:.2f})", flush=True)
    out = write_results("programs", results, args.out, args.quick)
    print(f"wrote {out}")
    fast.close()
    naive.inner.close()


if __name__ == "__main__":
    main()
