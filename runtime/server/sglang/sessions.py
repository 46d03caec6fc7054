"""SGLang's sessions (0.5.23 protocol): ``/open_session``, ``/close_session`` and the
``session_params`` / ``session_id`` fields of ``/generate``.

``POST|GET /open_session`` ``{"capacity_of_str_len": int, "session_id"?: str, "timeout"?:
seconds, "streaming"?: false, "cache_salt"?: str}`` → the session id as a JSON string.
``capacity_of_str_len`` bounds a turn's prompt plus ``max_new_tokens`` in tokens; ``timeout``
closes the session after that many idle seconds (default: the server's, 600 s); streaming
sessions (SGLang's ``--enable-streaming-session``) are not offered: ``streaming: true`` is a 400.
``cache_salt`` (agentlang) opens it in that tenant's namespace: it is invisible to other salts.

``POST /session_hint`` ``{"session_id", "next_use_s", "cache_salt"?}`` (agentlang's): the
session's next turn comes in about ``next_use_s`` seconds (0..86400), a next-use hint that
orders what is released under pressure (:mod:`agentlang.runtime.engine.sessions`) → ``{"session_id",
"held_pages"}``; 404 naming ``session_id`` for a session that is not open.

``POST|GET /close_session`` ``{"session_id", "cache_salt"?}`` → 200, empty body; its running
turns are aborted and the KV it held is released. An unknown id is a 404 naming ``session_id``
(SGLang logs and answers 200).

On ``/generate``: ``session_params`` ``{"id", "rid"?, "offset"?, "replace"?,
"drop_previous_output"?}`` continues a turn of an open session (the prompt is rebuilt from
the session's tree: :mod:`agentlang.runtime.session.session`); ``session_id`` keeps the
request's KV for the session without rebuilding anything (opened on first use). Not both, and
one prompt per session request. Errors: 400 / 404 / 413 / 429 naming the field.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from agentlang.runtime.server.errors import bad_request, from_value_error
from agentlang.runtime.server.openapi import SESSION_ERRORS, json_body
from agentlang.runtime.server.protocol import NON_EMPTY_TEXT, _Strict, documented, parse_body
from agentlang.runtime.server.sglang.output import Item
from agentlang.runtime.server.state import ServerState
from agentlang.runtime.session.session import SessionError, TurnParams

router = APIRouter()
_TURN_FIELDS = {"id": str, "rid": str, "offset": int, "replace": bool,
                "drop_previous_output": bool}


class OpenSessionRequest(_Strict):
    capacity_of_str_len: documented({"type": "integer", "minimum": 1})
    session_id: documented({"anyOf": [NON_EMPTY_TEXT, {"type": "null"}]}) = None
    timeout: documented({"anyOf": [{"type": "number", "exclusiveMinimum": 0},
                                   {"type": "null"}]}) = None
    streaming: bool | None = None
    cache_salt: documented({"anyOf": [NON_EMPTY_TEXT, {"type": "null"}]}) = None


class SessionHintRequest(_Strict):
    session_id: documented(NON_EMPTY_TEXT)
    next_use_s: documented({"type": "number", "minimum": 0, "maximum": 86400})
    cache_salt: documented({"anyOf": [NON_EMPTY_TEXT, {"type": "null"}]}) = None


class CloseSessionRequest(_Strict):
    session_id: documented(NON_EMPTY_TEXT)
    cache_salt: documented({"anyOf": [NON_EMPTY_TEXT, {"type": "null"}]}) = None


@router.api_route("/open_session", methods=["GET", "POST"], responses={429: SESSION_ERRORS[429]},
                  openapi_extra=json_body(OpenSessionRequest))
async def open_session(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, OpenSessionRequest)
    cap = req.capacity_of_str_len
    if isinstance(cap, bool) or not isinstance(cap, int):
        raise bad_request(f"capacity_of_str_len: required, an integer >= 1 (tokens), got "
                          f"{cap!r}", "capacity_of_str_len")
    if req.streaming:
        raise bad_request("streaming: streaming sessions are not supported by this server",
                          "streaming")
    try:
        sid = state.engine.sessions.open(req.session_id, req.capacity_of_str_len, req.timeout,
                                         _salt(req.cache_salt))
    except ValueError as e:
        raise from_value_error(e) from None
    return JSONResponse(sid)


@router.api_route("/close_session", methods=["GET", "POST"], response_class=Response,
                  openapi_extra=json_body(CloseSessionRequest),
                  responses={200: {"description": "Empty body."}, 404: SESSION_ERRORS[404]})
async def close_session(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, CloseSessionRequest)
    if not isinstance(req.session_id, str) or not req.session_id:
        raise bad_request(f"session_id: must be a non-empty string, got {req.session_id!r}",
                          "session_id")
    if not state.engine.sessions.close(req.session_id, _salt(req.cache_salt)):
        raise from_value_error(SessionError("session_id", f"no open session "
                                            f"{req.session_id!r}", 404))
    return Response(status_code=200)


@router.post("/session_hint", responses={404: SESSION_ERRORS[404]},
             openapi_extra=json_body(SessionHintRequest))
async def session_hint(request: Request):
    """agentlang's: the session's next turn comes in about ``next_use_s`` seconds (e.g. once
    the tool its last turn called is known). ``{"session_id", "held_pages"}``."""
    state: ServerState = request.app.state.server
    req = await parse_body(request, SessionHintRequest)
    if not isinstance(req.session_id, str) or not req.session_id:
        raise bad_request(f"session_id: must be a non-empty string, got {req.session_id!r}",
                          "session_id")
    try:
        held = state.engine.sessions.hint(req.session_id, req.next_use_s, _salt(req.cache_salt))
    except ValueError as e:
        raise from_value_error(e) from None
    return JSONResponse({"session_id": req.session_id, "held_pages": held})


def parse_turn(value: Any) -> TurnParams:
    """``session_params`` as :class:`TurnParams`; 400 naming the bad key."""
    if not isinstance(value, dict):
        raise bad_request(f"session_params: must be an object, got {value!r}", "session_params")
    for k, v in value.items():
        want = _TURN_FIELDS.get(k)
        if want is None:
            raise bad_request(f"session_params.{k}: unknown key; accepted: "
                              f"{', '.join(_TURN_FIELDS)}", f"session_params.{k}")
        if v is not None and (type(v) is not want or (want is int and v < 0)
                              or (want is str and not v)):
            what = {str: "a non-empty string", int: "an integer >= 0", bool: "a boolean"}[want]
            raise bad_request(f"session_params.{k}: must be {what}, got {v!r}",
                              f"session_params.{k}")
    if value.get("id") is None:
        raise bad_request("session_params.id: required (the id /open_session returned)",
                          "session_params.id")
    return TurnParams(value["id"], value.get("rid"), value.get("offset"),
                      bool(value.get("replace")), bool(value.get("drop_previous_output")))


def join_session(state: ServerState, session_params: Any, session_id: Any,
                 items: list[Item]) -> None:
    """Put the request's one item in its session: rebuild its prompt from the session's tree
    (``session_params``) or just tag it (``session_id``). Call last before queueing."""
    if session_params is None and session_id is None:
        return
    if session_params is not None and session_id is not None:
        raise bad_request("session_id: give session_id or session_params, not both",
                          "session_id")
    try:
        if session_id is not None:          # only the KV is kept: any batch, any n
            if not isinstance(session_id, str) or not session_id:
                raise bad_request(f"session_id: must be a non-empty string, got "
                                  f"{session_id!r}", "session_id")
            for it in items:
                it.params = it.params.replace(session=session_id)
                state.engine.sessions.check(it.params, len(it.ids))
            return
        if len(items) != 1 or items[0].params.n != 1:
            raise bad_request("session_params: a turn is one prompt with n = 1",
                              "session_params")
        item = items[0]
        salt = item.params.cache_salt
        turn = parse_turn(session_params)
        budget = 0 if item.sampling.prefill_only else item.params.max_tokens
        ids = state.engine.sessions.turn_prompt(turn, item.ids, budget, item.rid, salt)
        try:
            state.max_tokens_for(len(ids), max(budget, 1), "sampling_params.max_new_tokens",
                                 "session_params")
            item.params = item.params.replace(session=turn.id)
        except BaseException:
            state.engine.sessions.forget_turn(turn.id, item.rid, salt)
            raise
        item.ids = ids
    except SessionError as e:
        raise from_value_error(e) from None


def _salt(salt: Any) -> str | None:
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise bad_request(f"cache_salt: must be a non-empty string, got {salt!r}", "cache_salt")
    return salt
