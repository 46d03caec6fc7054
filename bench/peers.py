"""agentlang serve against the servers people would pick instead, side by side over HTTP.

Peers (installed beside the project by ``bench/install_peers.sh``, never by ``make test``):

- **vLLM CPU 0.32.0** (``.peers/vllm``: ``python -m vllm.entrypoints.openai.api_server``; the
  ``vllm`` CLI looks up a distribution named ``vllm``): bf16, prefix caching, 64 sequences, 2048
  batched tokens, both cores bound (``VLLM_CPU_OMP_THREADS_BIND=0-1``,
  ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``; its default keeps one core for the API server), a KV space
  of ``--vllm-kv-gib`` GiB (``VLLM_CPU_KVCACHE_SPACE``), on the embedded model's HF directory
  (the GGUF decoded once by ``weights="dense"``);
- **llama-server** (``.peers/llama.cpp``, the llama.cpp of llama-cpp-python 0.3.36): the same
  Q4_1 GGUF, ``-np 1 -t 2`` (one slot: its best batch-1 setting on 2 cores).

One load generator drives every side (``bench.serve``'s: one client task per request slot,
``/v1/completions`` with the prompt as token ids, greedy, ``ignore_eos``, streamed; TTFT = the
first SSE chunk with text). Each server runs alone on the machine (started, measured, stopped):
on 2 cores nothing may overlap. Workloads:

- ``shared``: ``bench.workloads.shared_prefix_chat`` (64 requests: a 1024-token shared system
  prompt + 32 unique tokens, 32 new) with 64 clients; vs vLLM;
- ``independent``: ``bench.workloads.independent`` (64 requests, 64–512-token prompts, 32–128
  new) with 64 clients; vs vLLM;
- ``single``: one request, 256 new tokens, not streamed (decode tok/s from the server's own
  token count over the wall time), prefill-512 (a 512-token prompt, ``max_tokens`` 1: prompt
  tok/s), and decode after a ``--history-tokens`` prompt (2048: an agent's history; streamed,
  tok/s from the first token on); vs llama-server and vLLM;
- ``json``: 32 concurrent chat completions with a ``json_schema`` response format (4 fields incl.
  an array), temperature 0.8, ``max_tokens`` 80 and 40: wall time and the share of outputs
  that parse and validate (``jsonschema``); vs vLLM.

    bench/install_peers.sh
    .venv/bin/python bench/peers.py [--quick] [--only shared independent single json]
                                    [--peers vllm llama]   # writes bench/results/peers.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.output import write_results  # noqa: E402
from bench.serve import _drive, sse_events, stop_server, summarize  # noqa: E402
from bench.workloads import Item, independent, shared_prefix_chat, text_of_tokens  # noqa: E402
from tests.support.cluster import free_port  # noqa: E402

PEERS = ROOT / ".peers"
VLLM_PY = PEERS / "vllm" / "bin" / "python"
LLAMA_SERVER = PEERS / "llama.cpp" / "build" / "bin" / "llama-server"
JSON_SCHEMA = {"type": "object", "additionalProperties": False,
               "required": ["name", "age", "city", "hobbies"],
               "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                              "city": {"type": "string"},
                              "hobbies": {"type": "array", "items": {"type": "string"}}}}


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen
    log: Path
    model: str                 # the name its OpenAI routes answer to


def launch(name: str, cmd: list[str], port: int, model: str, env: dict | None = None,
           timeout: float = 900, cwd: Path | None = None) -> Server:
    """Start ``cmd`` and wait until ``/v1/models`` answers (``timeout`` s; vLLM compiles).
    A peer runs outside the repository (``cwd`` a temporary folder): from its root, ``import
    kernels`` (which transformers tries) would find the repository's ``kernels/`` folder."""
    log = Path(tempfile.mkstemp(prefix=f"bench-peers-{name.split()[0]}-", suffix=".log")[1])
    proc = subprocess.Popen(cmd, cwd=cwd or tempfile.gettempdir(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                print(f"  {name} ready in {time.monotonic() - t0:.0f} s ({log})", flush=True)
                return Server(name, url, proc, log, model)
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"{name} did not start within {timeout:.0f} s ({log})")


def start_agentlang(dtype: str, weights: str, args, bf16_gemm_rows: int | None = None) -> Server:
    """``agentlang serve`` with ``args.kv_budget_mb`` of KV stored as ``args.kv_dtype`` (default
    auto: the model's dtype; and ``--bf16-gemm-rows`` when given)."""
    port = free_port()
    cmd = [sys.executable, "-m", "agentlang.runtime.server", "--port", str(port),
           "--dtype", dtype, "--weights", weights, "--kv-budget-mb", str(args.kv_budget_mb),
           "--max-batch-tokens", "2048", "--max-running", "64", "--log-level", "warning"]
    if bf16_gemm_rows is not None:
        cmd += ["--bf16-gemm-rows", str(bf16_gemm_rows)]
    kv = getattr(args, "kv_dtype", "auto")
    cmd += ["--kv-dtype", kv]
    return launch(f"agentlang ({dtype}, {weights}" + (f", KV {kv})" if kv != "auto" else ")"),
                  cmd, port, "default", cwd=ROOT)


def vllm_model_dir() -> Path:
    """The embedded model as a Hugging Face folder vLLM loads (decoded once from the GGUF)."""
    from agentlang.runtime.weights.model_loader import resolve_model

    hf_dir = resolve_model("default", "dense").path
    if not (hf_dir / "model.safetensors").exists():
        from agentlang.runtime import Engine
        Engine("default", weights="dense").shutdown()
    return hf_dir


def start_vllm(hf_dir: Path, args, dev: bool = False) -> Server:
    """vLLM's OpenAI server on ``hf_dir`` (``dev``: with its development routes, e.g.
    ``POST /reset_prefix_cache``)."""
    port = free_port()
    cmd = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_dir),
           "--served-model-name", "default", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", args.vllm_dtype, "--enable-prefix-caching", "--max-num-seqs", "64",
           "--max-num-batched-tokens", "2048", "--max-model-len", "2048"]
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_gib), **({"VLLM_SERVER_DEV_MODE": "1"} if dev else {})}
    return launch("vLLM CPU", cmd, port, "default", env)


def start_llama(gguf: Path, args, extra: tuple[str, ...] = ()) -> Server:
    """llama-server on ``gguf`` (``extra``: more flags, e.g. its speculation)."""
    port = free_port()
    cmd = [str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-np", "1", "-t", "2", "-tb", "2", "-c", "4096", "-b", "2048", "-ub", "512",
           "--alias", "default", *extra]
    return launch("llama-server", cmd, port, "default")


# ---- workloads -----------------------------------------------------------------------------
def streamed(server: Server, items: list[Item], clients: int) -> dict:
    """``items`` streamed over ``/v1/completions`` by ``clients`` concurrent tasks."""
    async def main() -> dict:
        limits = httpx.Limits(max_connections=clients + 4)
        async with httpx.AsyncClient(base_url=server.url, timeout=3600, limits=limits) as c:
            async def one(it: Item) -> tuple[float, int]:
                body = {"model": server.model, "prompt": it.prompt_ids, "stream": True,
                        "max_tokens": it.max_new_tokens, "temperature": 0, "ignore_eos": True,
                        "stream_options": {"include_usage": True}}
                t0 = time.perf_counter()
                first, n = None, 0
                async for event in sse_events(c, "/v1/completions", body):
                    if first is None and any(ch.get("text") for ch in event.get("choices", [])):
                        first = time.perf_counter() - t0
                    if event.get("usage"):
                        n = event["usage"]["completion_tokens"]
                return first if first is not None else time.perf_counter() - t0, n

            await one(Item(items[0].prompt_ids[:16], 2))      # warm-up
            ttfts, tokens, wall = await _drive(items, clients, one)
        return summarize(ttfts, tokens, wall)

    return asyncio.run(main())


def single(server: Server, tok, new_tokens: int, prefill_tokens: int, rounds: int,
           history_tokens: int = 0) -> dict:
    """Batch-1 decode (non-streamed, ``ignore_eos``) and prefill-``prefill_tokens`` rates; with
    ``history_tokens``, also the decode rate after a prompt that long (an agent's history:
    streamed, from the first token to the last, so the prefill is not counted)."""
    import random

    rng = random.Random(7)
    short = tok.encode("Once upon a time", add_special_tokens=False)
    decode, prefill, late = [], [], []
    with httpx.Client(base_url=server.url, timeout=3600) as c:
        def body(prompt: list[int], n: int, stream: bool = False) -> dict:
            return {"model": server.model, "prompt": prompt, "max_tokens": n,
                    "temperature": 0, "ignore_eos": True, "stream": stream}

        def post(prompt: list[int], n: int) -> tuple[float, int]:
            t0 = time.perf_counter()
            r = c.post("/v1/completions", json=body(prompt, n))
            r.raise_for_status()
            return time.perf_counter() - t0, r.json()["usage"]["completion_tokens"]

        def decode_after(prompt: list[int], n: int) -> float:
            """the n - 1 tokens after the first, a second (``ignore_eos``: exactly n; a chunk
            may carry several)"""
            first = None     # on a connection of its own: llama-server (0.3.36's) exits when
            # a request follows a finished stream at once on the same keep-alive connection
            with httpx.Client(base_url=server.url, timeout=3600) as sc, \
                    sc.stream("POST", "/v1/completions", json=body(prompt, n, True)) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if first is None and line.startswith("data: {") and \
                            json.loads(line[6:])["choices"][0].get("text"):
                        first = time.perf_counter()
            return (n - 1) / (time.perf_counter() - first)

        post(short, 4)                                                     # warm-up
        for _ in range(rounds):
            wall, n = post(short, new_tokens)
            decode.append(n / wall)
            ids = text_of_tokens(tok, prefill_tokens, rng)                 # never cached
            wall, _ = post(ids, 1)
            prefill.append(prefill_tokens / wall)
            if history_tokens:
                late.append(decode_after(text_of_tokens(tok, history_tokens, rng), new_tokens))
    med = lambda xs: sorted(xs)[len(xs) // 2]   # noqa: E731
    out = {"decode_tok_s": med(decode), "prefill_tok_s": med(prefill),
           "decode_rounds": decode, "prefill_rounds": prefill}
    if history_tokens:
        out.update({"history_tokens": history_tokens, "decode_after_history_tok_s": med(late),
                    "decode_after_history_rounds": late})
    return out


def constrained_json(server: Server, requests: int, max_tokens: int) -> dict:
    """``requests`` concurrent chat completions under :data:`JSON_SCHEMA`, T 0.8."""
    import jsonschema

    async def main() -> dict:
        async with httpx.AsyncClient(base_url=server.url, timeout=3600,
                                     limits=httpx.Limits(max_connections=requests + 4)) as c:
            async def one(i: int) -> tuple[bool, int, str]:
                body = {"model": server.model, "max_tokens": max_tokens, "temperature": 0.8,
                        "seed": i, "messages": [{"role": "user", "content":
                                                f"Invent person number {i}: name, age, city "
                                                f"and hobbies, as JSON."}],
                        "response_format": {"type": "json_schema", "json_schema": {
                            "name": "person", "schema": JSON_SCHEMA, "strict": True}}}
                r = await c.post("/v1/chat/completions", json=body)
                r.raise_for_status()
                out = r.json()
                text = out["choices"][0]["message"]["content"] or ""
                try:
                    jsonschema.validate(json.loads(text), JSON_SCHEMA)
                    ok = True
                except (ValueError, jsonschema.ValidationError):
                    ok = False
                return ok, out["usage"]["completion_tokens"], out["choices"][0]["finish_reason"]

            await one(-1)                                                  # warm-up
            t0 = time.perf_counter()
            res = await asyncio.gather(*[one(i) for i in range(requests)])
            wall = time.perf_counter() - t0
        return {"wall_s": wall, "valid": sum(ok for ok, _, _ in res), "requests": requests,
                "output_tokens": sum(n for _, n, _ in res),
                "finish_length": sum(f == "length" for _, _, f in res)}

    return asyncio.run(main())


# ---- the run --------------------------------------------------------------------------------
def measure(server: Server, todo: list[str], tok, args) -> dict:
    out: dict = {}
    try:
        if "shared" in todo and server.name != "llama-server":
            out["shared"] = streamed(server, shared_prefix_chat(tok, args.requests), args.clients)
            _line(server.name, "shared", out["shared"])
        if "independent" in todo and server.name != "llama-server":
            out["independent"] = streamed(server, independent(tok, args.requests), args.clients)
            _line(server.name, "independent", out["independent"])
        if "single" in todo:
            r = out["single"] = single(server, tok, args.new_tokens, 512, args.rounds,
                                       args.history_tokens)
            print(f"  {server.name:28s} single   decode {r['decode_tok_s']:6.1f} "
                  f"tok/s  prefill-512 {r['prefill_tok_s']:7.1f} tok/s" +
                  (f"  decode after {args.history_tokens} {r['decode_after_history_tok_s']:6.1f}"
                   f" tok/s" if args.history_tokens else ""), flush=True)
        if "json" in todo and server.name != "llama-server":
            for mt in (80, 40):
                r = out[f"json_{mt}"] = constrained_json(server, args.json_requests, mt)
                print(f"  {server.name:28s} json/{mt} {r['wall_s']:6.1f} s  valid "
                      f"{r['valid']}/{r['requests']}", flush=True)
    finally:
        stop_server(server.proc)
    return out


def _line(name: str, what: str, r: dict) -> None:
    print(f"  {name:28s} {what:11s} {r['tokens_per_s']:7.1f} out tok/s  TTFT mean "
          f"{r['ttft_mean_s']:.2f} s  p99 {r['ttft_p99_s']:.2f} s", flush=True)


def ratios(res: dict) -> dict:
    """agentlang / peer for every workload both sides ran (speed: higher is better), for each
    agentlang server (named by its dtype and weights when there are several)."""
    out = {}
    ours = {k: v for k, v in res.items() if k.startswith("agentlang")}
    for name, al in ours.items():
        tag = f"{name}: " if len(ours) > 1 else ""
        for peer in ("vLLM CPU", "llama-server"):
            p = res.get(peer, {})
            for w in ("shared", "independent"):
                if w in al and w in p:
                    out[f"{tag}{w} vs {peer}"] = al[w]["tokens_per_s"] / p[w]["tokens_per_s"]
            if "single" in al and "single" in p:
                out[f"{tag}decode vs {peer}"] = (al["single"]["decode_tok_s"]
                                                 / p["single"]["decode_tok_s"])
                out[f"{tag}prefill-512 vs {peer}"] = (al["single"]["prefill_tok_s"]
                                                      / p["single"]["prefill_tok_s"])
                late = "decode_after_history_tok_s"
                if late in al["single"] and late in p["single"]:
                    out[f"{tag}decode after {al['single']['history_tokens']} vs {peer}"] = (
                        al["single"][late] / p["single"][late])
            for mt in (80, 40):
                k = f"json_{mt}"
                if k in al and k in p:
                    out[f"{tag}json/{mt} speed vs {peer}"] = p[k]["wall_s"] / al[k]["wall_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=["shared", "independent", "single", "json"],
                    choices=["shared", "independent", "single", "json"])
    ap.add_argument("--peers", nargs="*", default=["vllm", "llama"], choices=["vllm", "llama"])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--json-requests", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--history-tokens", type=int, default=2048,
                    help="single: also decode after a prompt this long (0: not measured)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-budget-mb", type=float, default=1024)
    ap.add_argument("--kv-dtype", default="auto", choices=["auto", "bfloat16"],
                    help="agentlang's KV storage (bfloat16: a float32 model's K/V in bf16)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="agentlang's compute dtype (llama-server runs the GGUF)")
    ap.add_argument("--weights", nargs="+", default=["auto"], choices=["auto", "dense", "int8"],
                    help="agentlang's weights, one server each: auto (the GGUF's blocks), "
                         "dense (decoded to the compute dtype, what vLLM runs) and/or int8 (W8A8: "
                         "a lower precision than the peer's, reported as such)")
    ap.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="vLLM's dtype (the issue's setting: bf16; float32 where the CPU has no "
                         "bf16 instructions)")
    ap.add_argument("--vllm-kv-gib", type=float, default=4)
    ap.add_argument("--bf16-gemm-rows", type=int, default=None,
                    help="agentlang's --bf16-gemm-rows (weights auto: steps of this many tokens "
                         "as bf16 GEMMs; a float32 model's prefill)")
    ap.add_argument("--quick", action="store_true",
                    help="16 requests / clients, 8 JSON requests, 64 new tokens, 1 round")
    ap.add_argument("--out", help="JSON output (default bench/results/peers.json; --quick: a "
                                  "temporary directory)")
    args = ap.parse_args()
    if args.quick:
        args.requests = args.clients = 16
        args.json_requests, args.new_tokens, args.rounds = 8, 64, 1
    missing = [str(p) for p, want in ((VLLM_PY, "vllm"), (LLAMA_SERVER, "llama"))
               if want in args.peers and not p.exists()]
    if missing:
        sys.exit(f"missing peers {missing}: run bench/install_peers.sh first")
    from transformers import AutoTokenizer

    from agentlang.runtime.weights.model_loader import resolve_model

    gguf = resolve_model("default", "auto").path
    hf_dir = vllm_model_dir()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    starts = [lambda w=w: start_agentlang(args.dtype, w, args, args.bf16_gemm_rows)
              for w in args.weights]
    if "vllm" in args.peers:
        starts.append(lambda: start_vllm(hf_dir, args))
    if "llama" in args.peers:
        starts.append(lambda: start_llama(gguf, args))
    res = {}
    for start in starts:
        server = start()
        res[server.name] = measure(server, args.only, tok, args)
    result = {"machine": f"{os.cpu_count()}-core {platform.machine()} "
                         f"({platform.processor() or 'cpu'}), one server at a time",
              "model": "SmolLM2-135M-Instruct (Q4_1 GGUF; vLLM: the same decoded, bf16)",
              "command": "python bench/peers.py " + " ".join(sys.argv[1:]),
              "settings": {"agentlang": f"{args.dtype}, weights {'/'.join(args.weights)}, max_running 64, 2048 batched "
                                        f"tokens, KV {args.kv_budget_mb:.0f} MB, bf16_gemm_rows {args.bf16_gemm_rows}",
                           "vllm": f"{args.vllm_dtype}, prefix caching, 64 seqs, 2048 batched tokens, "
                                   f"OMP bind 0-1, 0 reserved cores, KV {args.vllm_kv_gib} GiB",
                           "llama-server": "-np 1 -t 2 -tb 2 -c 4096"},
              "workloads": {"requests": args.requests, "clients": args.clients,
                            "json_requests": args.json_requests, "new_tokens": args.new_tokens},
              "results": res, "agentlang_vs_peer": ratios(res)}
    out = write_results("peers", result, args.out, args.quick)
    for k, v in result["agentlang_vs_peer"].items():
        print(f"  agentlang / {k}: {v:.2f}x")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
