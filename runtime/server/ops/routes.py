"""Operations endpoints: ``/health``, ``/metrics`` (Prometheus text), ``/flush_cache`` (GET or
POST, as SGLang's). The model and server metadata routes live in :mod:`agentlang.runtime.server.sglang.info`."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from agentlang.runtime.server.state import ServerState

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    state: ServerState = request.app.state.server
    return {"status": "ok", "model": state.served_model_name}


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request):
    state: ServerState = request.app.state.server
    # off the event loop: the engine's figures are read under its step lock
    body = await asyncio.to_thread(state.metrics.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request):
    state: ServerState = request.app.state.server
    freed = await asyncio.to_thread(state.engine.flush_cache)
    return {"freed_pages": freed}
