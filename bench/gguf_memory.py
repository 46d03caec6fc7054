"""Peak memory of loading a ~1B-shaped Q4_0 GGUF quantized (weights="auto").

Writes a Llama-shaped GGUF (hidden 2048, 16 layers, 32/8 heads, ffn 8192, vocab 32000, untied
head: ~1.1B weights) of random Q4_0 blocks into a temp dir, then loads it in a fresh process
with a 256 MB KV pool and reports the process's peak RSS minus its RSS just before loading,
against 1.3 x (file size + KV pool).

    .venv/bin/python bench/gguf_memory.py      # writes bench/results/gguf_memory.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
DIMS = {"hidden": 2048, "ffn": 8192, "layers": 16, "heads": 32, "kv_heads": 8, "vocab": 32000}
KV_MB = 256


def write_model(path: Path) -> None:
    import gguf
    from gguf import GGMLQuantizationType as T

    d = DIMS
    H, hd = d["hidden"], d["hidden"] // d["heads"]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(d["layers"])
    w.add_context_length(4096)
    w.add_embedding_length(H)
    w.add_feed_forward_length(d["ffn"])
    w.add_head_count(d["heads"])
    w.add_head_count_kv(d["kv_heads"])
    w.add_layer_norm_rms_eps(1e-5)

    def q4(name, rows, cols):
        raw = rng.integers(0, 256, (rows, cols // 32, 18), dtype=np.uint8)
        raw[..., :2] = np.array([0.01], np.float16).view(np.uint8)      # block scale
        w.add_tensor(name, raw.reshape(rows, -1), raw_dtype=T.Q4_0)

    q4("token_embd.weight", d["vocab"], H)
    q4("output.weight", d["vocab"], H)
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    for i in range(d["layers"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(H, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(H, np.float32))
        q4(p + "attn_q.weight", H, H)
        q4(p + "attn_k.weight", d["kv_heads"] * hd, H)
        q4(p + "attn_v.weight", d["kv_heads"] * hd, H)
        q4(p + "attn_output.weight", H, H)
        q4(p + "ffn_gate.weight", d["ffn"], H)
        q4(p + "ffn_up.weight", d["ffn"], H)
        q4(p + "ffn_down.weight", H, d["ffn"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


CHILD = """
import json, sys, torch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.models.gguf_model import load_gguf_model
def rss(key="VmRSS"):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
before = rss()
m = load_gguf_model(sys.argv[1], "auto", torch.bfloat16)
c = m.config
pool = KVPool(KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, torch.bfloat16), 16,
              budget_mb=float(sys.argv[2]))
pool_bytes = pool.nbytes()
peak = rss("VmHWM")     # this process image's peak (ru_maxrss survives exec: a big parent's)
print(json.dumps({"rss_before": before, "peak_rss": peak, "rss_after": rss(),
                  "kv_pool_bytes": pool_bytes, "report": m.weights_report}))
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "llama-1b-shaped.Q4_0.gguf"
        write_model(path)
        size = path.stat().st_size
        out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(KV_MB)],
                             capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["file_bytes"] = size
    r["peak_minus_before"] = r["peak_rss"] - r["rss_before"]
    r["limit"] = 1.3 * (size + r["kv_pool_bytes"])
    r["ratio_to_file_plus_kv"] = r["peak_minus_before"] / (size + r["kv_pool_bytes"])
    r["dims"] = DIMS
    print(json.dumps(r, indent=2))
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "gguf_memory.json").write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
