"""The local CPU runtime on quantized GGUF weights, against llama.cpp on the same file.

On the embedded SmolLM2-135M-Instruct Q4_1 GGUF (tensors kept quantized, ``weights="auto"``):

* **Speed, peer in the same run** (llama.cpp through ``llama-cpp-python``, same file, same
  thread count): batch-1 decode tok/s and prefill-512 tok/s, the two runtimes interleaved
  round by round so machine load hits both alike; medians over rounds and their ratio.
* **Quality vs the dequantized fp32 model** (the same GGUF decoded to fp32): 50 prompts, the
  fp32 model's greedy continuation of 128 tokens, then every model is teacher-forced on
  prompt + continuation in one pass; at each of the 128 positions top-1 agreement with the fp32
  greedy token and KL(fp32 || model). Models: Q4_1 as shipped (int4), Q8_0 (the fp32 weights
  re-quantized to a Q8_0 GGUF written here), each with the native kernels (float32 and bf16
  compute) and with torch's, bf16 dense beside; the Q8_0 models also against their own file
  decoded to fp32.
* **Greedy invariance on the quantized path**: the same prompts alone, batched, with chunked
  prefill (8-token chunks), from a warm cache, and preempted (a pool too small for all eight)
  — the share of identical greedy tokens; in float32 and in bfloat16 (whose calls of
  ``BF16_GEMM_ROWS`` rows or more run as bf16 GEMMs: batch-shape dependent).

    .venv/bin/python bench/cpu_local.py     # writes bench/results/cpu_local_{speed,quality}.json
    .venv/bin/python bench/cpu_local.py --quick
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.weights.model_loader import resolve_model
from agentlang.runtime.models.gguf_model import load_gguf_model
from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.models.int8_calibration import quantize_model

ROOT = Path(__file__).resolve().parent
THREADS = 2


def speed(gguf: Path, rounds: int, decode_tokens: int, prefill_tokens: int, dtype: str) -> dict:
    """Batch-1 decode and prefill tok/s of agentlang and llama.cpp, interleaved by round."""
    from llama_cpp import Llama

    eng = Engine(str(gguf), dtype=dtype, weights="auto", kv_budget_mb=64, enable_prefix_cache=False,
                 max_batch_tokens=max(2048, prefill_tokens))
    llm = Llama(str(gguf), n_ctx=2048, n_threads=THREADS, n_threads_batch=THREADS,
                n_batch=prefill_tokens, verbose=False)
    prompt = list(range(1000, 1000 + prefill_tokens))
    short = eng.tokenizer.encode("Once upon a time")
    res: dict[str, list[float]] = {k: [] for k in ("al_decode", "al_prefill", "cpp_decode", "cpp_prefill")}
    eng.generate(short, SamplingParams(max_tokens=4, temperature=0))           # warm-up
    for _ in range(rounds):
        t = time.perf_counter()
        eng.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
        res["al_prefill"].append(prefill_tokens / (time.perf_counter() - t))
        out = eng.generate(short, SamplingParams(max_tokens=decode_tokens, temperature=0,
                                                 ignore_eos=True))
        res["al_decode"].append((decode_tokens - 1) / (out.meta["latency_s"] - out.meta["ttft_s"]))
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        res["cpp_prefill"].append(prefill_tokens / (time.perf_counter() - t))
        llm.reset()
        llm.eval(short)
        tok = short[-1]
        t = time.perf_counter()
        for _ in range(decode_tokens - 1):
            llm.eval([tok])
        res["cpp_decode"].append((decode_tokens - 1) / (time.perf_counter() - t))
    med = {k: statistics.median(v) for k, v in res.items()}
    med["decode_ratio"] = med["al_decode"] / med["cpp_decode"]
    med["prefill_ratio"] = med["al_prefill"] / med["cpp_prefill"]
    med["rounds"] = {k: [round(x, 1) for x in v] for k, v in res.items()}
    return med


def write_q8_0(src: Path, dst: Path) -> None:
    """``src`` with every quantized matrix decoded to fp32 and re-quantized to Q8_0."""
    import gguf
    from gguf import GGMLQuantizationType as T

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        if t.tensor_type in (T.F32, T.F16):
            w.add_tensor(t.name, t.data.astype("float32"))
        else:
            x = gguf.quants.dequantize(t.data, t.tensor_type)
            w.add_tensor(t.name, gguf.quants.quantize(x, T.Q8_0), raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def all_logits(model, seq: list[int], n_last: int) -> torch.Tensor:
    """Log-probs ``[n_last, V]`` predicting the last ``n_last`` tokens of ``seq`` (one pass)."""
    cfg = model.config
    pages = -(-len(seq) // 16)
    pool = KVPool(KVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, model.norm.weight.dtype),
                  16, num_pages=pages + 1)
    table = PageAllocator(pages + 1).allocate(pages)
    rows = list(range(len(seq) - n_last - 1, len(seq) - 1))
    batch = build_forward_batch([seq], [0], [table], 16, logits_rows=[rows])
    return torch.log_softmax(model(batch, pool, TorchAttentionBackend()).double(), dim=-1)


def int8_model(gguf: Path, dtype: torch.dtype, tokenizer):
    """The GGUF decoded to ``dtype``, its linears int8 W8A8 as ``weights="int8"`` loads them."""
    m = load_gguf_model(gguf, "dense", dtype)
    quantize_model(m, tokenizer)
    return m


def quality(gguf: Path, prompts: list[str], positions: int, workdir: Path,
            only: list[str] | None = None) -> dict:
    ref = load_gguf_model(gguf, "dense", torch.float32)
    eng = Engine(str(gguf), weights="dense", kv_budget_mb=256)
    ids = [eng.tokenizer.encode(p) for p in prompts]
    outs = eng.generate(ids, SamplingParams(max_tokens=positions, temperature=0, ignore_eos=True))
    seqs = [i + o.token_ids for i, o in zip(ids, outs)]
    q8 = workdir / "q8_0.gguf"
    write_q8_0(gguf, q8)
    models = {"Q4_1 (native blocks)": lambda: load_gguf_model(gguf, "auto", torch.float32),
              "Q4_1 (torch int4 kernel)": lambda: load_gguf_model(gguf, "auto", torch.float32,
                                                                  kernels="torch"),
              "Q8_0 (native blocks)": lambda: load_gguf_model(q8, "auto", torch.float32),
              "Q8_0 (torch int8 per row)": lambda: load_gguf_model(q8, "auto", torch.float32,
                                                                   kernels="torch"),
              "Q4_1 (native, bf16 compute)": lambda: load_gguf_model(gguf, "auto", torch.bfloat16),
              "Q8_0 (native, bf16 compute)": lambda: load_gguf_model(q8, "auto", torch.bfloat16),
              "Q8_0 file decoded to fp32": lambda: load_gguf_model(q8, "dense", torch.float32),
              "bf16 dense": lambda: load_gguf_model(gguf, "dense", torch.bfloat16),
              "int8 W8A8 (fp32 compute)": lambda: int8_model(gguf, torch.float32, eng.tokenizer),
              "int8 W8A8 (bf16 compute)": lambda: int8_model(gguf, torch.bfloat16, eng.tokenizer)}
    if only:
        models = {k: v for k, v in models.items() if any(o in k for o in only)}
    refs = [all_logits(ref, s, positions) for s in seqs]
    q8_ref = load_gguf_model(q8, "dense", torch.float32)
    # a runtime's own error: against its file decoded exactly (the Q8_0 file is itself a
    # re-quantization of the fp32 model, which costs agreement before any kernel runs)
    own = {"Q8_0": [all_logits(q8_ref, s, positions) for s in seqs]}
    del q8_ref
    res = {}
    for name, make in models.items():
        m = make()
        res[name] = agreement(m, seqs, refs, positions)
        line = f"  {name:28s} top-1 {res[name]['top1_agreement']:.4f}  KL {res[name]['mean_kl']:.5f}"
        if name.startswith("Q8_0 ("):
            res[name]["vs_own_file"] = agreement(m, seqs, own["Q8_0"], positions, by_ref=True)
            line += (f"  | vs the Q8_0 file in fp32: top-1 {res[name]['vs_own_file']['top1_agreement']:.4f}"
                     f"  KL {res[name]['vs_own_file']['mean_kl']:.5f}")
        print(line, flush=True)
    return res


def agreement(model, seqs: list[list[int]], refs: list[torch.Tensor], positions: int,
              by_ref: bool = False) -> dict:
    """Top-1 agreement and mean KL(ref || model) over the last ``positions`` of each sequence.
    The top-1 target is the sequence's own next token (the fp32 model's greedy choice), or
    with ``by_ref`` the reference's argmax."""
    agree = kl = n = 0
    for s, r in zip(seqs, refs):
        lp = all_logits(model, s, positions)
        target = r.argmax(-1) if by_ref else torch.tensor(s[-positions:])
        agree += int((lp.argmax(-1) == target).sum())
        kl += float((r.exp() * (r - lp)).sum(-1).sum())
        n += positions
    return {"top1_agreement": agree / n, "mean_kl": kl / n}


def invariance(gguf: Path, prompts: list[str], n_tokens: int, dtype: str,
               weights: str = "auto") -> dict:
    p = SamplingParams(max_tokens=n_tokens, temperature=0, ignore_eos=True)
    eng = Engine(str(gguf), weights=weights, dtype=dtype, kv_budget_mb=128)
    alone = [eng.generate(x, p).token_ids for x in prompts]
    warm = [eng.generate(x, p).token_ids for x in prompts]       # prompts now in the radix cache
    eng.flush_cache()
    batched = [o.token_ids for o in eng.generate(prompts, p)]
    chunked_eng = Engine(str(gguf), weights=weights, dtype=dtype, kv_budget_mb=128,
                         max_batch_tokens=8)
    chunked = [o.token_ids for o in chunked_eng.generate(prompts, p)]
    # pages for the two longest sequences only: the 8 cannot all run, some are preempted
    longest = max(len(eng.tokenizer.encode(x)) for x in prompts) + n_tokens
    small = Engine(str(gguf), weights=weights, dtype=dtype, page_size=4,
                   num_pages=2 * -(-longest // 4) + 2, max_batch_tokens=256)
    preempted = [o.token_ids for o in small.generate(prompts, p)]

    def share(a, b):
        same = sum(x == y for u, v in zip(a, b) for x, y in zip(u, v))
        return same / sum(len(u) for u in a)

    runs = {"batched": batched, "chunked": chunked, "warm": warm, "preempted": preempted}
    res = {("warm_cache_vs_cold" if k == "warm" else f"{k}_vs_alone"): share(alone, v)
           for k, v in runs.items()}
    res |= {f"identical_sequences_{k}": sum(a == b for a, b in zip(alone, v))
            for k, v in runs.items()}
    return res | {"preemptions": small.metrics()["preemptions"], "prompts": len(prompts),
                  "tokens_each": n_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", nargs="*", default=[], choices=["speed", "quality", "invariance"])
    ap.add_argument("--out-dir", default=str(ROOT / "results"),
                    help="cpu_local_speed.json (speed) and cpu_local_quality.json (the rest)")
    ap.add_argument("--models", nargs="*", default=None,
                    help="quality: only the variants whose name contains one of these (e.g. "
                         "int8); the others keep their last results")
    ap.add_argument("--invariance-weights", nargs="*", default=["auto"], choices=["auto", "int8"])
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    gguf = resolve_model("default", "auto").path
    prompts = json.loads((ROOT / "data" / "kv_quant_prompts.json").read_text())
    n_prompts, positions = (8, 32) if args.quick else (50, 128)
    res = {"machine": f"{platform.processor() or platform.machine()}, {THREADS} threads, "
                      f"load average {os.getloadavg()[0]:.1f} at start (shared machine)",
           "model": gguf.name}
    if "speed" not in args.skip:
        for dtype in ("float32", "bfloat16"):      # compute dtype (bf16: batched calls as GEMMs)
            r = res[f"speed_{dtype}"] = speed(gguf, 3 if args.quick else 5, 64, 512, dtype)
            print(f"speed ({dtype} compute):", {k: v for k, v in r.items() if k != "rounds"})
    if "quality" not in args.skip:
        with tempfile.TemporaryDirectory() as d:
            res["quality"] = quality(gguf, prompts[:n_prompts], positions, Path(d), args.models)
    if "invariance" not in args.skip:
        for weights, dtype in itertools.product(args.invariance_weights, ("float32", "bfloat16")):
            key = "_".join(["invariance"] + (["int8"] if weights == "int8" else [])
                           + (["bfloat16"] if dtype == "bfloat16" else []))
            res[key] = invariance(gguf, prompts[:8], 32 if args.quick else 64, dtype, weights)
            print(f"invariance ({weights}, {dtype}):", res[key])
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    head = {k: res[k] for k in ("machine", "model")}
    for name, keys in (("speed", [k for k in res if k.startswith("speed_")]),
                       ("quality", [k for k in res if k.startswith(("quality", "invariance"))])):
        path = out / f"cpu_local_{name}.json"
        if keys:        # a part skipped this run keeps its last results
            old = json.loads(path.read_text()) if path.exists() else {}
            if "quality" in keys and args.models:     # the variants not rerun keep theirs
                res["quality"] = old.get("quality", {}) | res["quality"]
            path.write_text(json.dumps(old | head | {k: res[k] for k in keys}, indent=2))
            print("wrote", path)


if __name__ == "__main__":
    main()
