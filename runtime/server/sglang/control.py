"""SGLang's request-control routes: ``/abort_request`` and ``/concate_and_append_request``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from agentlang.runtime.server.openapi import json_body
from agentlang.runtime.server.protocol import _Strict, parse_body
from agentlang.runtime.server.state import ServerState

router = APIRouter()


class AbortRequest(_Strict):
    rid: str = ""
    abort_all: bool = False


class ConcateAndAppendRequest(_Strict):
    src_rids: list[str]
    dst_rid: str


@router.post("/abort_request", response_class=Response, openapi_extra=json_body(AbortRequest),
             responses={200: {"description": "Empty body."}})
async def abort_request(request: Request):
    """Abort the request ``rid`` (or every running /generate request with ``abort_all``);
    an unknown or finished ``rid`` is a no-op, as in SGLang."""
    state: ServerState = request.app.state.server
    req = await parse_body(request, AbortRequest)
    rids = list(state.native_rids) if req.abort_all else [req.rid] if req.rid else []
    for rid in rids:
        state.engine.abort(rid)
    return Response(status_code=200)


@router.post("/concate_and_append_request", response_class=Response,
             openapi_extra=json_body(ConcateAndAppendRequest),
             responses={200: {"description": "Empty body."}})
async def concate_and_append_request(request: Request):
    """SGLang's frontend calls this after joining forks (``src_rids`` are its fork states,
    ``dst_rid`` the parent); it already re-sends the joined text in full with the next
    request, whose shared prefix the radix cache finds. No server state is keyed by these ids,
    so accepting the call leaves everything consistent."""
    await parse_body(request, ConcateAndAppendRequest)
    return Response(status_code=200)
