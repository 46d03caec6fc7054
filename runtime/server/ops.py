"""Operations endpoints: ``/health``, ``/metrics`` (Prometheus text), ``/get_model_info``,
``/flush_cache``."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from runtime.kv_plan import describe_engine
from runtime.server.state import ServerState

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    state: ServerState = request.app.state.server
    return {"status": "ok", "model": state.served_model_name}


@router.get("/metrics")
async def metrics(request: Request):
    state: ServerState = request.app.state.server
    # off the event loop: the engine's figures are read under its step lock
    body = await asyncio.to_thread(state.metrics.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/get_model_info")
async def get_model_info(request: Request):
    state: ServerState = request.app.state.server
    e = state.engine
    mc, pool = e.model_config, e.pool
    return {
        "model_name": state.served_model_name,
        "model_path": str(e.model_path),
        "is_generation": True,
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


@router.post("/flush_cache")
async def flush_cache(request: Request):
    state: ServerState = request.app.state.server
    freed = await asyncio.to_thread(state.engine.flush_cache)
    return {"freed_pages": freed}
