"""agentlang programs on the local runtime vs the same programs run as naive sequential calls.

(a) tree of thought: 3 levels × 3 branches (3 + 9 + 27 thoughts) over a shared problem prompt;
(b) few-shot QA: 32 questions after one few-shot block, via ``run_batch``.

agentlang: forks and the batch run concurrently on one engine with the radix prefix cache, so
shared prefixes are prefilled once and branches decode together. Naive baseline: the same
programs, every generation a separate blocking call (one at a time) on an engine with the
prefix cache off — what a hand-written loop over a completion API does.

    python bench/programs.py [--quick] [--dtype float32]

``--vs vllm`` (issue 29) instead runs the same programs with fixed-length generations
(``ignore_eos``, no stop strings: both sides generate the same number of tokens) against two
servers, one at a time: ``agentlang serve`` through ``RuntimeEndpoint`` and vLLM's CPU server
(``bench/install_peers.sh vllm``) through ``al.OpenAI(api="completions")``, the prompts
rendered with the same chat template, both in ``--dtype`` (bf16 by default), each server's
prefix cache emptied before every timed round; medians of ``--rounds``:

    python bench/programs.py --vs vllm [--rounds 3] [--weights dense]
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
def tree_of_thought(s, problem, depth=3, width=3, tokens=12, end="\n"):
    s += al.user(problem)
    s += al.assistant_begin()
    frontier = [s]
    for level in range(depth):
        nxt = []
        for node in frontier:
            forks = node.fork(width)
            forks += lambda i: f"\nIdea {level + 1}.{i + 1}:"
            forks += al.gen(f"idea{level}", max_tokens=tokens, stop=end)
            nxt.extend(forks)
        frontier = nxt
    for node in frontier:
        node.sync()
    s += al.assistant_end()


@al.function
def few_shot(s, country, tokens=8, end="\n"):
    s += FEW_SHOT + f"Question: What is the capital of {country}?\nAnswer:"
    s += al.gen("answer", max_tokens=tokens, stop=end)


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


def generated_tokens(url: str, metric: str) -> float:
    """The sum of a Prometheus counter's series (``metric``, any labels) at ``url/metrics``."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(metric) and line[len(metric)] in " {")


def fixed_cases(depth: int, questions: list[str]) -> list[tuple[str, str, int, Any]]:
    """(name, workload, tokens it generates, run(backend)): the programs with fixed-length
    generations (no stop string, ``ignore_eos``), greedy."""
    gens = sum(3 ** (level + 1) for level in range(depth))
    return [
        ("tree_of_thought", f"{depth} levels x 3 branches, {gens} gens of 12 tokens", gens * 12,
         lambda b: tree_of_thought.run(problem=PROBLEM, depth=depth, end=None, temperature=0,
                                       ignore_eos=True, backend=b)),
        ("few_shot_batch", f"{len(questions)} questions of 8 tokens, run_batch",
         len(questions) * 8,
         lambda b: few_shot.run_batch([{"country": c, "end": None} for c in questions],
                                      temperature=0, ignore_eos=True, backend=b)),
    ]


class FixedLength(al.RuntimeEndpoint):
    """``RuntimeEndpoint`` whose chat template stops no generation (its end-of-turn string
    would end a fixed-length gen early even with ``ignore_eos``); the vLLM side gets the same
    template."""

    def chat_template(self):
        import dataclasses

        return dataclasses.replace(super().chat_template(), stop_str=())


def versus_vllm(args, depth: int, questions: list[str]) -> dict:
    """The fixed-length programs on ``agentlang serve`` and on vLLM, one server at a time."""
    import statistics
    from types import SimpleNamespace

    import httpx

    from bench.peers import VLLM_PY, start_agentlang, start_vllm, vllm_model_dir
    from bench.serve import stop_server

    if not VLLM_PY.exists():
        sys.exit("vLLM is not installed: run bench/install_peers.sh vllm first")
    cases = fixed_cases(depth, questions)
    conf = SimpleNamespace(kv_budget_mb=1024, vllm_dtype=args.vllm_dtype, vllm_kv_gib=4,
                           kv_dtype=args.kv_dtype)
    sides = {}
    template = None
    for side in ("agentlang", "vllm"):
        server = (start_agentlang(args.dtype, args.weights, conf) if side == "agentlang"
                  else start_vllm(vllm_model_dir(), conf, dev=True))
        try:
            if side == "agentlang":
                backend = FixedLength(server.url)
                template = backend.chat_template()
                flush, metric = "/flush_cache", "agentlang_generation_tokens_total"
            else:
                backend = al.OpenAI("default", base_url=server.url + "/v1", api="completions",
                                    chat_template=template, extended_sampling=True)
                flush, metric = "/reset_prefix_cache", "vllm:generation_tokens_total"
            out = {}
            for name, workload, tokens, run in cases:
                run(backend)                                              # warm-up
                times, made = [], []
                for _ in range(args.rounds):
                    httpx.post(server.url + flush, timeout=60).raise_for_status()
                    before = generated_tokens(server.url, metric)
                    t, _ = timed(lambda: run(backend))
                    times.append(t)
                    made.append(generated_tokens(server.url, metric) - before)
                out[name] = {"workload": workload, "wall_s": statistics.median(times),
                             "rounds_s": times, "generated_tokens": made,
                             "expected_tokens": tokens}
                print(f"  {server.name:28s} {name:16s} {statistics.median(times):6.2f} s "
                      f"(rounds {', '.join(f'{x:.2f}' for x in times)}; tokens {made[0]:.0f} "
                      f"of {tokens})", flush=True)
            sides[side] = out
        finally:
            stop_server(server.proc)
    runs = []
    for name, workload, tokens, _ in cases:
        a, v = sides["agentlang"][name], sides["vllm"][name]
        runs.append({"program": name, "workload": workload, "agentlang_s": a["wall_s"],
                     "vllm_s": v["wall_s"], "speedup_vs_vllm": v["wall_s"] / a["wall_s"],
                     "agentlang": a, "vllm": v})
        print(f"{name:16s} agentlang {a['wall_s']:6.2f}s  vLLM {v['wall_s']:6.2f}s  "
              f"→ {v['wall_s'] / a['wall_s']:4.2f}× vLLM's speed", flush=True)
    return {"runs": runs, "settings": {
        "agentlang": f"agentlang serve --dtype {args.dtype} --weights {args.weights} "
                     f"--kv-dtype {args.kv_dtype}, RuntimeEndpoint",
        "vllm": f"vLLM CPU 0.32.0, {args.vllm_dtype}, prefix caching, "
                     "64 seqs, 2048 batched tokens, both cores bound, KV 4 GiB; "
                     "al.OpenAI(api='completions', extended_sampling=True)"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="depth 2 and 8 questions")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                    help="default: float32 (naive baseline), bfloat16 (--vs vllm)")
    ap.add_argument("--vs", choices=("naive", "vllm"), default="naive",
                    help="the baseline: naive sequential calls (default) or vLLM's server")
    ap.add_argument("--weights", default="dense", choices=("dense", "auto"),
                    help="agentlang serve's weights with --vs vllm")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds a side (--vs vllm)")
    ap.add_argument("--kv-dtype", default="auto", choices=("auto", "bfloat16"),
                    help="agentlang serve's KV storage with --vs vllm (bfloat16: a float32 "
                    "model's K/V in bf16)")
    ap.add_argument("--vllm-dtype", default="bfloat16", choices=("float32", "bfloat16"),
                    help="vLLM's dtype (--vs vllm; default bf16, its fastest on CPU)")
    ap.add_argument("--out", help="JSON output (default: bench/results/programs.json, "
                    "programs_vllm.json with --vs vllm; a --quick run: a temporary directory)")
    args = ap.parse_args()
    depth = 2 if args.quick else 3
    if args.vs == "vllm":
        args.dtype = args.dtype or "bfloat16"
        questions = COUNTRIES[: 8 if args.quick else 32]
        results = {"machine": "2-core x86_64 CPU, 24 GiB", "model": "SmolLM2-135M-Instruct",
                   "dtype": args.dtype, "vllm_dtype": args.vllm_dtype, "command": "python bench/programs.py " +
                   " ".join(sys.argv[1:]), **versus_vllm(args, depth, questions)}
        print(f"wrote {write_results('programs_vllm', results, args.out, args.quick)}")
        return
    args.dtype = args.dtype or "float32"
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
