"""Command line of the server: ``python -m agentlang.runtime.server`` and ``agentlang serve``.

- ``add_serve_arguments(parser)`` adds the flags to any parser;
- ``add_serve_command(subparsers)`` adds the ``serve`` sub-command (its ``handler`` default
  is :func:`serve_main`) to a console script's sub-parsers;
- ``main(argv, prog)`` parses ``argv`` and serves (``python -m agentlang.runtime.server``);
- ``serve_main(args) -> int`` loads the engine, prints what it loaded and the URL once the
  socket listens, and serves in the foreground until Ctrl-C / SIGTERM (clean shutdown: open
  streams get a short grace period, then the engine loop stops). Returns the exit code.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from collections.abc import Callable

import uvicorn

from agentlang.runtime.cache.kv_quant import KV_DTYPES
from agentlang.runtime.core.program_service import SCHEDULE_POLICIES
from agentlang.runtime.weights.model_loader import WEIGHTS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
ENGINE_FLAGS = ("page_size", "kv_budget_mb", "window_kv_fraction", "max_batch_tokens", "max_running",
                "grammar_backend", "dtype", "kv_dtype", "schedule_low_priority_values_first",
                "max_wait_steps", "max_lower_priority_tokens", "urgent_slots", "weights",
                "speculative", "speculative_max_draft", "speculative_row_cost",
                "speculative_shared_cap", "schedule_policy", "bf16_gemm_rows",
                "max_sessions", "session_hold_s", "session_max_fraction", "session_timeout_s")


def add_serve_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--model", default="default",
                   help="'default' (the embedded model), a local Hugging Face model directory, "
                        "or a .gguf file (Llama, Mistral, Qwen2 / 3, Phi-3 / 4, Gemma 2 / 3)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="TCP port (default 30000)")
    p.add_argument("--page-size", type=int, default=None, help="KV page size in tokens")
    p.add_argument("--kv-budget-mb", type=float, default=None,
                   help="memory for the KV pool in MB (default: the engine's)")
    p.add_argument("--window-kv-fraction", type=float, default=None,
                   help="sliding-window models (Gemma 2 / 3): the sliding layers' KV pages per "
                        "global page, in (0, 1] (default: (window + 2 pages) / (4 windows); "
                        "'agentlang kv-plan' names the one for a context)")
    p.add_argument("--max-batch-tokens", type=int, default=None,
                   help="most tokens computed in one engine step")
    p.add_argument("--max-running", type=int, default=None,
                   help="most requests in the running batch")
    p.add_argument("--grammar-backend", choices=("xgrammar", "outlines"), default=None,
                   help="structured-output backend (default xgrammar)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="model and KV dtype (default float32)")
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default=None,
                   help="KV cache storage (default auto: the model dtype)")
    p.add_argument("--schedule-low-priority-values-first", action="store_true", default=None,
                   help="serve lower 'priority' values first (vLLM's habit; default: higher "
                        "first, as SGLang)")
    p.add_argument("--max-wait-steps", type=int, default=None,
                   help="aging: each this many steps waited raise a request's priority by one")
    p.add_argument("--max-lower-priority-tokens", type=int, default=None,
                   help="while a higher-priority prefill is scheduled, lower-priority requests "
                        "get at most this many tokens of the step (default 8)")
    p.add_argument("--urgent-slots", type=int, default=None,
                   help="requests that outrank a running one may run this many above "
                        "--max-running before they preempt (default 4; 0: preempt as soon "
                        "as the batch is full)")
    p.add_argument("--weights", choices=WEIGHTS, default=None,
                   help="dense (default): decoded to --dtype; auto: a GGUF's Q4_0/Q4_1/Q8_0 "
                        "tensors stay quantized (native AVX-512 VNNI or AVX2 kernels over the file's "
                        "blocks where the CPU has them, else torch's int4/int8 kernels); int8: the "
                        "dense weights quantized to int8 per output channel and the activations per "
                        "token, int8 GEMMs (CPU only; fastest for batches, less precise)")
    p.add_argument("--bf16-gemm-rows", type=int, default=None,
                   help="with --weights auto on a CPU with bf16 instructions (AVX512-BF16, AMX): "
                        "calls of this many rows or more (prefill chunks) run as bf16 GEMMs over "
                        "the GGUF's weights dequantized for the call. A float32 model then "
                        "prefills at bf16's precision, so a token's output can differ between a "
                        "long prefill and a short one; decode steps stay exact (default: 32 in a "
                        "bfloat16 model, never in a float32 one)")
    p.add_argument("--speculative", action=argparse.BooleanOptionalAction, default=None,
                   help="model-free speculative decoding for requests that do not set "
                        "'speculative': drafts copied from the request's own context, verified "
                        "in one pass, outputs unchanged (default off)")
    p.add_argument("--speculative-max-draft", type=int, default=None,
                   help="most draft tokens a request verifies in one step, 1..32 (default 16)")
    p.add_argument("--speculative-row-cost", type=float, default=None,
                   help="what one more row of a step costs relative to a one-row step, in "
                        "(0, 1]: the draft-length policy's model (default: measured on this "
                        "machine and model at the first draft decision, a 9-row step against a "
                        "1-row one after 512 tokens; also the 'live' schedule's busy bound, "
                        "0.35 when not given)")
    p.add_argument("--schedule-policy", choices=SCHEDULE_POLICIES, default=None,
                   help="order of waiting requests of equal priority: 'lpm' longest cached "
                        "prefix first (default), 'program' the request whose program (session, "
                        "DSL run or agent label) has had the least service first (Autellix's PLAS), "
                        "'continue' the one whose program has had the most (programs under way "
                        "finish first), 'live' as 'continue' and, once the KV pool is short, "
                        "no new program while as many are live (running or held) as fit")
    p.add_argument("--speculative-shared-cap", type=int, default=None,
                   help="entries of the index of recent outputs that drafts are also copied "
                        "from (per cache namespace, least recently used evicted; 0: drafts from "
                        "the request's own context only; default 65536, ~16 MB at most)")
    p.add_argument("--max-sessions", type=int, default=None,
                   help="most sessions open at once (/open_session, session_id; default 1024)")
    p.add_argument("--session-hold-s", type=float, default=None,
                   help="seconds a finished session turn's KV is held for its next turn at "
                        "most (default 30; 0: sessions keep nothing)")
    p.add_argument("--session-max-fraction", type=float, default=None,
                   help="share of the KV pool session holds may keep, in [0, 1] (default 0.8)")
    p.add_argument("--session-timeout-s", type=float, default=None,
                   help="idle seconds after which a session closes itself (default 600)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health")
    p.add_argument("--served-model-name", default=None,
                   help="model name clients use (default: the model directory's name)")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    return p


def add_serve_command(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="serve a model over HTTP (OpenAI-compatible and native APIs)",
        description="Serve a model over HTTP: /v1/chat/completions, /v1/completions, "
                    "/v1/models, /generate, /metrics, ...")
    add_serve_arguments(p)
    p.set_defaults(handler=serve_main)
    return p


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine settings given on the command line (flags left out keep the defaults)."""
    return {k: getattr(args, k) for k in ENGINE_FLAGS if getattr(args, k, None) is not None}


def describe(engine, url: str, api_key: bool) -> str:
    pool = engine.pool
    lines = [
        f"agentlang runtime serving {engine.model_name} at {url}",
        f"  model   {engine.model_path} ({engine.model_config.num_layers} layers, "
        f"{engine.config.dtype}, context {engine.max_context})",
        f"  KV pool {pool.num_pages} pages x {pool.page_size} tokens = {pool.capacity_tokens} "
        f"tokens, {pool.nbytes() / 2**20:.1f} MiB ({engine.kv_layout.kv_dtype_name})"
        + ("" if pool.windows is None else f"; sliding layers {pool.windows.num_window_pages} "
           f"pages (window {engine.kv_layout.window})"),
        f"  batch   max {engine.config.max_batch_tokens} tokens/step, "
        f"{engine.config.max_running} running; grammar {engine.config.grammar_backend}",
        f"  OpenAI  {url}/v1  (chat/completions, completions, models)",
        f"  native  {url}/generate, /metrics, /health, /get_model_info"
        + ("  [API key required]" if api_key else ""),
        "  Ctrl-C to stop",
    ]
    return "\n".join(lines)


def serve_main(args: argparse.Namespace) -> int:
    from agentlang.runtime.engine.engine import Engine
    from agentlang.runtime.server.app import create_app

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"loading model {args.model!r} ...", flush=True)
    t0 = time.perf_counter()
    try:
        engine = Engine(args.model, **engine_kwargs(args))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"loaded {engine.model_name} in {time.perf_counter() - t0:.1f} s", flush=True)
    app = create_app(engine, api_key=args.api_key, served_model_name=args.served_model_name)
    # what is loaded lives as long as the process: out of the collector's sight, a full
    # collection no longer walks the model, the tokenizer and the app (~4% of decode here)
    gc.collect()
    gc.freeze()
    url = f"http://{args.host}:{args.port}"
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=3, lifespan="on")
    server = _Server(config, lambda: print(describe(engine, url, args.api_key is not None),
                                           flush=True))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        engine.shutdown()
    return 0 if server.started else 1


class _Server(uvicorn.Server):
    """uvicorn's server, calling ``on_ready`` once the socket listens."""

    def __init__(self, config, on_ready: Callable[[], None]):
        super().__init__(config)
        self.on_ready = on_ready

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            self.on_ready()


def main(argv: list[str] | None = None, prog: str = "python -m agentlang.runtime.server") -> int:
    parser = add_serve_arguments(argparse.ArgumentParser(
        prog=prog,
        description="Serve a model over HTTP (OpenAI-compatible and native APIs)."))
    return serve_main(parser.parse_args(argv))
