"""KV cache quantization: quality against the full-precision cache, and capacity.

On the embedded model (SmolLM2-135M-Instruct, fp32 weights on CPU), for each 8-bit KV format
(int8, fp8_e4m3, fp8_e5m2; per-token-per-head fp16 scales, see ``runtime/cache/kv_quant.py``):

* **Teacher-forced agreement.** For each prompt of ``bench/data/kv_quant_prompts.json`` the
  full-precision run (fp32 KV) decodes greedily for ``--positions`` steps; every quantized run
  is fed the *same* tokens (teacher forcing on the full-precision greedy continuation) in
  lockstep, one pool per format, the same batch metadata for all. At each generated position we
  compare the next-token distributions: mean KL(full || quantized) and top-1 agreement (the
  quantized argmax equals the full-precision greedy token). Decode runs through the runtime's
  paged torch attention backend, so every context token is read back from the (quantized) pool.
* **Perplexity** of ``bench/data/kv_quant_text.txt`` (a fixed local text), prefilled in chunks
  of 256 tokens so later chunks attend over the quantized cache of earlier ones.
* **Memory per token** (``KVLayout.bytes_per_token``, scales included) and the number of
  concurrent 4096-token requests that fit in a fixed KV budget (whole 16-token pages).

    .venv/bin/python bench/kv_quant.py          # 50 prompts x 128 positions, writes
                                                # bench/results/kv_quant.json
    .venv/bin/python bench/kv_quant.py --quick  # 8 prompts x 32 positions, 256-token text
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from agentlang.runtime.attention.base import make_backend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.models.kv_plan import kv_layout, max_concurrent_requests
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.weights.model_loader import resolve_model
from agentlang.runtime.models.llama import LlamaModel

ROOT = Path(__file__).resolve().parent
QUANT_DTYPES = ("int8", "fp8_e4m3", "fp8_e5m2")
MEMORY_DTYPES = ("float32", "bfloat16", "float16") + QUANT_DTYPES
BUDGET_GIB = 4.0
REQUEST_TOKENS = 4096
PAGE_SIZE = 16
NEAR_TIE = 0.05      # nats between the full-precision top-2 log-probs


def load_prompts() -> list[str]:
    return json.loads((ROOT / "data" / "kv_quant_prompts.json").read_text())


def load_text() -> str:
    return (ROOT / "data" / "kv_quant_text.txt").read_text()


def load_model() -> tuple[LlamaModel, object]:
    from transformers import AutoTokenizer

    path = resolve_model().path
    return LlamaModel.from_pretrained(path, torch.float32), AutoTokenizer.from_pretrained(path)


def _layout(model: LlamaModel, kv_dtype: str) -> KVLayout:
    c = model.config
    return KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, torch.float32, kv_dtype)


def teacher_forced(model: LlamaModel, prompts: list[list[int]], kv_dtypes: tuple[str, ...],
                   positions: int, page_size: int = PAGE_SIZE) -> dict:
    """Lockstep decode of all ``prompts`` (token ids) for ``positions`` generated positions.

    Returns ``{"continuations": [[ids]], dtype: {"kl_mean", "kl_max", "top1_agreement",
    "positions", "disagreement_gaps"}}``; the full-precision ("auto") pool picks the greedy
    tokens; ``disagreement_gaps`` are the full-precision top-2 log-prob gaps (nats) where the
    quantized argmax differs (small gaps: near-ties)."""
    backend = make_backend("torch", torch.device("cpu"))
    n_pages = [-(-(len(p) + positions) // page_size) for p in prompts]
    starts = [sum(n_pages[:b]) for b in range(len(prompts))]
    tables = [list(range(s, s + n)) for s, n in zip(starts, n_pages)]
    pools = {dt: KVPool(_layout(model, dt), page_size, num_pages=sum(n_pages))
             for dt in ("auto",) + tuple(kv_dtypes)}
    kl_sum = {dt: 0.0 for dt in kv_dtypes}
    kl_max = {dt: 0.0 for dt in kv_dtypes}
    agree = {dt: 0 for dt in kv_dtypes}
    gaps: dict[str, list[float]] = {dt: [] for dt in kv_dtypes}
    conts: list[list[int]] = [[] for _ in prompts]
    for t in range(positions):
        if t == 0:
            batch = build_forward_batch(prompts, [0] * len(prompts), tables, page_size)
        else:
            batch = build_forward_batch([[c[-1]] for c in conts],
                                        [len(p) + t - 1 for p in prompts], tables, page_size)
        ref = torch.log_softmax(model(batch, pools["auto"], backend), -1)       # [B, V]
        greedy = ref.argmax(-1)
        top2 = ref.topk(2, -1).values
        gap = top2[:, 0] - top2[:, 1]                                           # [B]
        for dt in kv_dtypes:
            logp = torch.log_softmax(model(batch, pools[dt], backend), -1)
            kl = (ref.exp() * (ref - logp)).sum(-1)                             # [B]
            kl_sum[dt] += kl.sum().item()
            kl_max[dt] = max(kl_max[dt], kl.max().item())
            same = logp.argmax(-1) == greedy
            agree[dt] += same.sum().item()
            gaps[dt] += gap[~same].tolist()
        for c, g in zip(conts, greedy.tolist()):
            c.append(g)
    n = len(prompts) * positions
    out: dict = {"continuations": conts}
    for dt in kv_dtypes:
        out[dt] = {"kl_mean": kl_sum[dt] / n, "kl_max": kl_max[dt],
                   "top1_agreement": agree[dt] / n, "positions": n,
                   "disagreement_gaps": sorted(gaps[dt])}
    return out


def perplexity(model: LlamaModel, ids: list[int], kv_dtype: str, chunk: int = 256,
               page_size: int = PAGE_SIZE) -> float:
    """exp(mean NLL) of ``ids[1:]``, prefilled in chunks over a ``kv_dtype`` pool."""
    backend = make_backend("torch", torch.device("cpu"))
    table = list(range(-(-len(ids) // page_size)))
    pool = KVPool(_layout(model, kv_dtype), page_size, num_pages=len(table))
    nll, count = 0.0, 0
    for s in range(0, len(ids) - 1, chunk):
        e = min(s + chunk, len(ids) - 1)          # rows s..e-1 predict ids[s+1..e]
        batch = build_forward_batch([ids[s:e]], [s], [table], page_size,
                                    logits_rows=[list(range(e - s))])
        logp = torch.log_softmax(model(batch, pool, backend), -1)              # [e-s, V]
        target = torch.tensor(ids[s + 1: e + 1])
        nll -= logp.gather(1, target[:, None]).sum().item()
        count += e - s
    return math.exp(nll / count)


def memory_table(model: LlamaModel) -> list[dict]:
    """Bytes per token and 4k-request capacity in a fixed budget, per storage dtype."""
    c = model.config
    cfg = {"num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
           "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim}
    budget = int(BUDGET_GIB * 2**30)
    bf16 = kv_layout(cfg, "bfloat16", "bfloat16").bytes_per_token()
    fp32 = kv_layout(cfg, "float32", "float32").bytes_per_token()
    rows = []
    for dt in MEMORY_DTYPES:
        bpt = kv_layout(cfg, dt, "float32").bytes_per_token()
        rows.append({
            "kv_dtype": dt, "bytes_per_token": bpt,
            "ratio_vs_bf16": bpt / bf16, "ratio_vs_fp32": bpt / fp32,
            "requests_4k_in_budget": max_concurrent_requests(budget, bpt, REQUEST_TOKENS,
                                                             PAGE_SIZE),
        })
    return rows


def run(n_prompts: int, positions: int, ppl_tokens: int | None) -> dict:
    t0 = time.time()
    model, tok = load_model()
    prompts = [tok.encode(p) for p in load_prompts()[:n_prompts]]
    tf = teacher_forced(model, prompts, QUANT_DTYPES, positions)
    t_tf = time.time() - t0
    ids = tok.encode(load_text())
    if ppl_tokens is not None:
        ids = ids[:ppl_tokens]
    ppl = {dt: perplexity(model, ids, dt) for dt in ("auto",) + QUANT_DTYPES}
    mem = {r["kv_dtype"]: r for r in memory_table(model)}
    results = []
    for dt in ("auto",) + QUANT_DTYPES:
        m = mem["float32" if dt == "auto" else dt]
        q = tf.get(dt, {"kl_mean": 0.0, "kl_max": 0.0, "top1_agreement": 1.0})
        g = q.get("disagreement_gaps", [])
        results.append({"kv_dtype": "fp32 (auto)" if dt == "auto" else dt,
                        "kl_mean": q["kl_mean"], "kl_max": q["kl_max"],
                        "top1_agreement": q["top1_agreement"],
                        "disagreements": len(g),
                        "disagreements_near_tie": sum(x < NEAR_TIE for x in g),
                        "perplexity": ppl[dt],
                        "bytes_per_token": m["bytes_per_token"],
                        "ratio_vs_bf16": m["ratio_vs_bf16"],
                        "requests_4k_in_budget": m["requests_4k_in_budget"]})
    int8 = next(r for r in results if r["kv_dtype"] == "int8")
    return {
        "bench": "kv_quant",
        "model": "SmolLM2-135M-Instruct (fp32 weights, CPU, torch attention backend)",
        "prompts": len(prompts), "positions_per_prompt": positions,
        "perplexity_tokens": len(ids), "page_size": PAGE_SIZE,
        "budget_gib": BUDGET_GIB, "request_tokens": REQUEST_TOKENS, "near_tie_nats": NEAR_TIE,
        "results": results,
        "memory": list(mem.values()),
        "targets": {"int8_bytes_per_token_le_0.53x_bf16": int8["ratio_vs_bf16"] <= 0.53,
                    "int8_top1_agreement_ge_0.95": int8["top1_agreement"] >= 0.95},
        "seconds": {"teacher_forced": round(t_tf, 1), "total": round(time.time() - t0, 1)},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    "torch": torch.__version__},
    }


def print_table(res: dict) -> None:
    print(f"{res['prompts']} prompts x {res['positions_per_prompt']} positions, perplexity over "
          f"{res['perplexity_tokens']} tokens; {res['seconds']['total']} s")
    print(f"{'kv dtype':<12}{'mean KL':>10}{'max KL':>9}{'top-1':>8}{'ties':>9}{'ppl':>8}"
          f"{'B/token':>9}{'x bf16':>8}{'4k reqs/' + str(int(res['budget_gib'])) + 'GiB':>14}")
    for r in res["results"]:
        ties = f"{r['disagreements_near_tie']}/{r['disagreements']}"
        print(f"{r['kv_dtype']:<12}{r['kl_mean']:>10.5f}{r['kl_max']:>9.4f}"
              f"{100 * r['top1_agreement']:>7.2f}%{ties:>9}{r['perplexity']:>8.3f}"
              f"{r['bytes_per_token']:>9}{r['ratio_vs_bf16']:>8.3f}"
              f"{r['requests_4k_in_budget']:>14}")
    print(f"ties: disagreements where the full-precision top-2 are within {NEAR_TIE} nats")
    print("targets:", res["targets"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 prompts x 32 positions, 256-token text")
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--positions", type=int, default=None)
    ap.add_argument("--out", default=None,
                    help="JSON output (default bench/results/kv_quant.json for a full run)")
    a = ap.parse_args()
    n = a.prompts or (8 if a.quick else 50)
    pos = a.positions or (32 if a.quick else 128)
    res = run(n, pos, 256 if a.quick else None)
    print_table(res)
    out = a.out or (None if a.quick else str(ROOT / "results" / "kv_quant.json"))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(res, indent=1) + "\n")
        print("wrote", out)


if __name__ == "__main__":
    main()
