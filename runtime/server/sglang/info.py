"""SGLang's metadata and health routes: ``/model_info``, ``/server_info`` (and their
deprecated ``/get_`` aliases), ``/health_generate``.

Field names and meanings follow SGLang 0.5.23's HTTP server, because SGLang's frontend
(``RuntimeEndpoint`` reads ``model_path``) and ``sglang-router`` (worker discovery reads the
model and tokenizer paths, the served name, the context length and the KV capacity) read them.
agentlang's own fields (KV pool layout, capacity plan) follow SGLang's in the same objects; a
client that does not know them ignores them.

- ``GET /model_info``: ``model_path``, ``served_model_name``, ``tokenizer_path``,
  ``is_generation``, ``preferred_sampling_params``, ``weight_version``, ``load_format``,
  ``reasoning_parser``, ``tool_call_parser`` (SGLang's parser names for the served template's
  family: ``qwen3``; ``qwen25``, ``mistral``, ``llama3``; agentlang's own ``tool_format`` names
  the format exactly), ``disaggregation_mode``,
  ``has_image_understanding``, ``has_audio_understanding``, ``model_type``, ``architectures``.
- ``GET /server_info``: the server's resolved settings under SGLang's argument names
  (``model_path``, ``tokenizer_path``, ``served_model_name``, ``context_length``,
  ``page_size``, ``max_running_requests``, ``chunked_prefill_size``, ``tp_size``,
  ``dp_size``, ``dtype``, ``kv_cache_dtype``, ...), the scheduler's ``max_total_num_tokens``
  and ``max_req_input_len``, ``internal_states`` (one entry: this engine), ``version``.
- ``GET /health_generate``: runs a one-token greedy generation; 200 with an empty body when a
  token comes back within the timeout, 503 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from agentlang.runtime.grammar.tool_format import FORMATS, SGLANG_REASONING
from agentlang.runtime.models.kv_plan import describe_engine
from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.server.state import ServerState

router = APIRouter()

HEALTH_TIMEOUT_S = 20.0
SGLANG_PROTOCOL_VERSION = "0.5.23"   # the SGLang release whose native protocol this mirrors


def _hf_config(model_path: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def model_info(state: ServerState) -> dict[str, Any]:
    """The ``/model_info`` object (SGLang's fields first, then agentlang's)."""
    e = state.engine
    mc, pool = e.model_config, e.pool
    hf = _hf_config(e.hf_dir)
    path = str(e.hf_dir)
    fmt = state.family.tool_format if state.family.native_tools else None
    return {
        # SGLang 0.5.23's fields
        "model_path": path,
        "served_model_name": state.served_model_name,
        "tokenizer_path": path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": SGLANG_REASONING.get(state.family.reasoning),
        "tool_call_parser": next(iter(FORMATS[fmt].sglang), None) if fmt else None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": hf.get("model_type"),
        "architectures": hf.get("architectures") or [mc.architecture],
        # agentlang's
        "tool_format": fmt,                  # grammar.tool_format.FORMATS key (None: own prompt)
        "model_name": state.served_model_name,
        "weights_path": str(e.model_path),   # the weights as loaded (a .gguf file or model_path)
        "max_context": e.max_context,
        "max_tokens_per_sequence": state.token_limit,
        "vocab_size": mc.vocab_size,
        "num_layers": mc.num_layers,
        "num_kv_heads": mc.num_kv_heads,
        "head_dim": mc.head_dim,
        "dtype": e.config.dtype,
        "kv_dtype": e.kv_layout.kv_dtype_name,
        "page_size": pool.page_size,
        "kv_pool": {"num_pages": pool.num_pages, "bytes": pool.nbytes(),
                    "capacity_tokens": pool.capacity_tokens,
                    "bytes_per_token": pool.layout.bytes_per_token()},
        "grammar_backend": e.config.grammar_backend,
        "max_batch_tokens": e.config.max_batch_tokens,
        "max_running": e.config.max_running,
        "capacity": describe_engine(e),
    }


def server_info(state: ServerState) -> dict[str, Any]:
    """The ``/server_info`` object: settings under SGLang's server-argument names."""
    e = state.engine
    cfg, pool = e.config, e.pool
    path = str(e.hf_dir)
    kv = e.kv_layout.kv_dtype_name
    scheduler = {"max_total_num_tokens": pool.capacity_tokens,
                 "max_req_input_len": state.token_limit - 1}
    return {
        "model_path": path,
        "tokenizer_path": path,
        "tokenizer_mode": "auto",
        "served_model_name": state.served_model_name,
        "is_embedding": False,
        "context_length": e.max_context,
        "dtype": cfg.dtype,
        "kv_cache_dtype": "auto" if kv == cfg.dtype else kv,
        "page_size": pool.page_size,
        "max_running_requests": cfg.max_running,
        "max_total_tokens": pool.capacity_tokens,
        "chunked_prefill_size": cfg.max_batch_tokens,
        "max_prefill_tokens": cfg.max_batch_tokens,
        "grammar_backend": cfg.grammar_backend,
        "disable_radix_cache": not cfg.enable_prefix_cache,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "device": cfg.device,
        "api_key": None,
        "disaggregation_mode": "null",
        "skip_tokenizer_init": False,
        **scheduler,
        "status": "ready",
        "startup_time": state.created,
        "internal_states": [{**scheduler, "engine": "agentlang",
                             "kv_pages_used": e.allocator.num_used}],
        "version": SGLANG_PROTOCOL_VERSION,
        "frontend": "python",
    }


@router.get("/model_info")
@router.get("/get_model_info")          # SGLang's deprecated alias; its frontend still calls it
async def get_model_info(request: Request):
    return model_info(request.app.state.server)


@router.get("/server_info")
@router.get("/get_server_info")         # SGLang's deprecated alias
async def get_server_info(request: Request):
    return server_info(request.app.state.server)


@router.get("/health_generate", response_class=Response, responses={
    200: {"description": "A one-token generation came back (empty body)."},
    503: {"description": "No token within the timeout, or the engine failed (empty body)."}})
async def health_generate(request: Request):
    state: ServerState = request.app.state.server
    params = SamplingParams(max_tokens=1, temperature=0.0)
    rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
    try:
        out = await asyncio.wait_for(state.engine.async_generate([0], params, rid),
                                     HEALTH_TIMEOUT_S)
    except (asyncio.TimeoutError, RuntimeError):
        state.engine.abort(rid)
        return Response(status_code=503)
    return Response(status_code=503 if out is None or out.error else 200)
