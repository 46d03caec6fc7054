"""Q4_K_M GGUF files made by llama.cpp's own ``llama-quantize``: agentlang against llama-server
on the same file, in the same run, over HTTP (``/v1/completions``, non-streamed, greedy,
``ignore_eos``), one server at a time, both on the machine's 2 cores.

Shapes (random F16 weights written here with the ``gguf`` package, the embedded SmolLM2's
tokenizer in the metadata, then ``llama-quantize ... Q4_K_M``): ``smollm2`` (SmolLM2-135M's
layout), ``llama1b`` (hidden 2048, 16 layers, 32/8 heads, ffn 8192: ~1.1B) and ``qwen3``
(Qwen3-0.6B's layout: hidden 1024, 28 layers, 16/8 heads of 128, ffn 3072, q/k norms; the
49152-token vocabulary instead of 151k), ``gemma3`` (Gemma 3 270M's layout: hidden 640, 18
layers, 4/1 heads of 256, ffn 2048, sliding window 512 in 5 of 6 layers, RoPE 1M / 10k, q/k
and sandwich norms, tied embeddings; 49152 tokens instead of 262k). Reported: batch-1 decode tok/s (256 new tokens) and
prefill-512 tok/s (a 512-token prompt, one new token), medians over rounds, and agentlang /
llama-server. Requires ``bench/install_peers.sh llama`` (llama-server and llama-quantize).

    .venv/bin/python bench/cpu_kquants.py            # writes bench/results/cpu_kquants.json
    .venv/bin/python bench/cpu_kquants.py --shapes smollm2 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gguf_memory import CHILD, KV_MB  # noqa: E402
from bench.output import write_results  # noqa: E402
from bench.peers import LLAMA_SERVER, PEERS, launch, single, start_llama  # noqa: E402
from tests.support.cluster import free_port  # noqa: E402

QUANTIZE = PEERS / "llama.cpp" / "build" / "bin" / "llama-quantize"
SHAPES = {   # arch, hidden, layers, heads, kv heads, head dim, ffn
    "smollm2": ("llama", 576, 30, 9, 3, 64, 1536),
    "llama1b": ("llama", 2048, 16, 32, 8, 64, 8192),
    "qwen3": ("qwen3", 1024, 28, 16, 8, 128, 3072),
    "gemma3": ("gemma3", 640, 18, 4, 1, 256, 2048),
}
GEMMA3_WINDOW = 512   # Gemma 3 270M's: 5 of every 6 layers see their last 512 keys


def write_f16(path: Path, shape: str) -> None:
    """A random F16 GGUF of ``shape`` with the embedded model's tokenizer."""
    import gguf

    from agentlang.runtime.weights.model_loader import resolve_model

    arch, H, L, nh, nkv, hd, I = SHAPES[shape]
    src = gguf.GGUFReader(str(resolve_model("default", "auto").path))
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    for f in src.fields.values():
        if f.name.startswith("tokenizer."):
            w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    w.add_block_count(L)
    w.add_context_length(4096)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0 if arch == "gemma3" else 10000.0)
    if arch == "gemma3":
        w.add_sliding_window(GEMMA3_WINDOW)
        w.add_float32("gemma3.rope.freq_base_swa", 10000.0)

    def mat(name, rows, cols):
        w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16))

    def vec(name, n):
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", vocab, H)
    vec("output_norm.weight", H)
    if arch != "gemma3":                      # Gemma ties its embeddings
        mat("output.weight", vocab, H)
    for i in range(L):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", H)
        vec(p + "ffn_norm.weight", H)
        mat(p + "attn_q.weight", nh * hd, H)
        mat(p + "attn_k.weight", nkv * hd, H)
        mat(p + "attn_v.weight", nkv * hd, H)
        mat(p + "attn_output.weight", H, nh * hd)
        mat(p + "ffn_gate.weight", I, H)
        mat(p + "ffn_up.weight", I, H)
        mat(p + "ffn_down.weight", H, I)
        if arch in ("qwen3", "gemma3"):
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        if arch == "gemma3":
            vec(p + "post_attention_norm.weight", H)
            vec(p + "post_ffw_norm.weight", H)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def q4_k_m(shape: str, work: Path) -> Path:
    f16, out = work / f"{shape}.f16.gguf", work / f"{shape}.Q4_K_M.gguf"
    write_f16(f16, shape)
    subprocess.run([str(QUANTIZE), str(f16), str(out), "Q4_K_M", "2"], check=True,
                   capture_output=True)
    f16.unlink()
    return out


MODES = {   # agentlang's modes: the server's --dtype and --bf16-gemm-rows
    "float32": ("float32", None),
    "bfloat16": ("bfloat16", None),
    "float32-gemm": ("float32", 64),    # float32, calls of 64+ rows (prefill) as bf16 GEMMs
}


def start_agentlang(gguf: Path, kv_mb: float, mode: str = "float32"):
    dtype, gemm_rows = MODES[mode]
    port = free_port()
    cmd = [sys.executable, "-m", "agentlang.runtime.server", "--model", str(gguf), "--port",
           str(port), "--dtype", dtype, "--weights", "auto", "--kv-budget-mb", str(kv_mb),
           "--log-level", "warning"]
    if gemm_rows is not None:
        cmd += ["--bf16-gemm-rows", str(gemm_rows)]
    return launch(f"agentlang {mode} (weights auto)", cmd, port, "default", cwd=ROOT)


def weights_report(gguf: Path) -> dict:
    """How the file loads (types kept / decoded, the one-call decode layer) and the load's
    memory in a fresh process: peak RSS - RSS before, against 1.3 x (file + a 256 MB KV pool)
    (bench/gguf_memory.py's measure)."""
    import json

    from agentlang.runtime.models.gguf_model import load_gguf_model

    m = load_gguf_model(gguf, "auto")
    out = {"report": m.weights_report, "native_decoder": m.native_decoder is not None}
    del m
    r = json.loads(subprocess.run([sys.executable, "-c", CHILD, str(gguf), str(KV_MB)],
                                  capture_output=True, text=True, check=True, cwd=ROOT
                                  ).stdout.strip().splitlines()[-1])
    size = gguf.stat().st_size
    out["memory"] = {"peak_minus_before_mb": round((r["peak_rss"] - r["rss_before"]) / 2**20, 1),
                     "file_plus_kv_mb": round((size + r["kv_pool_bytes"]) / 2**20, 1),
                     "ratio": round((r["peak_rss"] - r["rss_before"]) / (size + r["kv_pool_bytes"]), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--memory-only", action="store_true", help="load memory and types, no speed")
    ap.add_argument("--dtype", nargs="+", default=["float32"], choices=list(MODES),
                    help="agentlang's modes, each its own server (bfloat16: calls of 32+ rows as "
                         "bf16 GEMMs where the CPU has bf16 instructions; float32-gemm: a float32 "
                         "model whose calls of 64+ rows, the prefill's, run as bf16 GEMMs)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not (LLAMA_SERVER.exists() and QUANTIZE.exists()):
        sys.exit("missing llama-server / llama-quantize: run bench/install_peers.sh llama first")
    from transformers import AutoTokenizer

    from agentlang.runtime.weights.model_loader import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("default", "dense").path)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            print(f"== {shape}: writing F16, llama-quantize Q4_K_M", flush=True)
            gguf = q4_k_m(shape, Path(tmp))
            row = {"file_mb": round(gguf.stat().st_size / 2**20, 1), **weights_report(gguf)}
            print(f"  loads as {row['report']}, native decode layer {row['native_decoder']}, "
                  f"memory {row['memory']}", flush=True)
            res[shape] = row
            if args.memory_only:
                continue
            starts = [(f"agentlang {d}", lambda d=d: start_agentlang(gguf, 256, d)) for d in args.dtype]
            for key, start in (*starts, ("llama-server", lambda: start_llama(gguf, args))):
                server = start()
                try:
                    r = single(server, tok, args.new_tokens, args.prefill_tokens, args.rounds)
                finally:
                    server.proc.terminate()
                    server.proc.wait(60)
                row[key] = r
                print(f"  {server.name}: decode {r['decode_tok_s']:.1f} tok/s, "
                      f"prefill-{args.prefill_tokens} {r['prefill_tok_s']:.1f} tok/s", flush=True)
            b = row["llama-server"]
            for d in args.dtype:
                a = row[f"agentlang {d}"]
                ratio = {"decode": a["decode_tok_s"] / b["decode_tok_s"],
                         "prefill": a["prefill_tok_s"] / b["prefill_tok_s"]}
                row[f"agentlang_{d}_vs_llama"] = ratio
                print(f"  agentlang {d} / llama-server: decode {ratio['decode']:.2f}x, "
                      f"prefill {ratio['prefill']:.2f}x", flush=True)
    result = {"machine": f"{os.cpu_count()}-core {platform.machine()} ({platform.processor() or 'cpu'})",
              "command": "python bench/cpu_kquants.py " + " ".join(sys.argv[1:]),
              "settings": {"agentlang": f"{' and '.join(args.dtype)}, weights auto "
                                        "(K-quants native), KV 256 MB",
                           "llama-server": "-np 1 -t 2 -tb 2 -c 4096 -b 2048 -ub 512"},
              "new_tokens": args.new_tokens, "prefill_tokens": args.prefill_tokens,
              "rounds": args.rounds, "results": res}
    print(f"wrote {write_results('cpu_kquants', result, args.out, False)}")


if __name__ == "__main__":
    main()
