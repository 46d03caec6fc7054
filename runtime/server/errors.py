"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` for every failure.

Handlers turn :class:`APIError`, request-validation errors (FastAPI's 422 → 400), unknown routes
(404/405) and unexpected exceptions (500) into that shape, so a client always gets JSON it can
read and the server keeps serving. A failed engine request carries a typed
:class:`~agentlang.runtime.core.errors.EngineError` (code + field) whose status comes from the one table
:data:`ENGINE_ERROR_STATUS`; validation ``ValueError`` messages start with the field they are
about (``"max_tokens: must be ..."``), which :func:`from_value_error` turns into ``param``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentlang.runtime.core.errors import EngineError, EngineValueError, ErrorCode
from agentlang.runtime.session.session import SessionError

log = logging.getLogger("agentlang.runtime.server")

_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*):\s")


class APIError(Exception):
    """An error answered as ``status`` with the OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# The one table from an engine error code to the HTTP status and the error body's ``code``.
ENGINE_ERROR_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.KV_POOL_EXCEEDED: (400, "context_length_exceeded"),
    ErrorCode.CONTEXT_EXCEEDED: (400, "context_length_exceeded"),
    ErrorCode.INVALID_CONSTRAINT: (400, "invalid_constraint"),
    ErrorCode.ENGINE_FAILURE: (500, "engine_failure"),
}


def engine_error(err: EngineError, param_map: dict[str, str] | None = None) -> APIError:
    """The HTTP error for a typed engine error; ``param_map`` renames the engine's field to
    the request's (``{"prompt": "text"}``)."""
    status, code = ENGINE_ERROR_STATUS[err.code]
    param = (param_map or {}).get(err.field, err.field) if err.field is not None else None
    message = err.message if param is None else f"{param}: {err.message}"
    return APIError(status, message, param, code)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def field_of(message: str) -> str | None:
    """The field a ``ValueError`` message names (its ``"field: ..."`` prefix), if any."""
    m = _FIELD_PREFIX.match(message)
    return m.group(1) if m else None


def from_value_error(exc: ValueError, param_map: dict[str, str] | None = None,
                     default_param: str | None = None) -> APIError:
    """A 400 for an engine/sampling ``ValueError``; ``param_map`` renames engine field names
    to request field names (``{"json_schema": "response_format"}``). A typed
    :class:`EngineValueError` takes its status and code from :data:`ENGINE_ERROR_STATUS`, a
    :class:`SessionError` its own status (404 unknown session, 413 over capacity, 429 too
    many sessions)."""
    if isinstance(exc, EngineValueError):
        return engine_error(exc.error, param_map)
    if isinstance(exc, SessionError):
        return APIError(exc.status, str(exc), exc.field, "invalid_session")
    message = str(exc)
    field = field_of(message)
    param = field if field is not None else default_param
    if param_map and field is not None:
        base = field.split("[")[0].split(".")[0]
        if base in param_map:
            param = param_map[base]
    if field is not None and param != field:
        message = f"{param}{message[len(field):]}"
    elif field is None and param is not None:
        message = f"{param}: {message}"
    return APIError(400, message, param, None)


def loc_to_param(loc: Sequence[str | int]) -> str | None:
    """``("body", "messages", 0, "role")`` → ``"messages[0].role"``; ``("query", "max_nodes")``
    → ``"max_nodes"`` (the request part is not part of the field's name)."""
    out = ""
    for part in loc:
        if part in ("body", "query", "path", "header") and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or None


def validation_error(errors: Sequence[dict], prefix: str = "") -> APIError:
    """The first pydantic error as a 400 naming its field."""
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {first.get('msg')}",
                        None, "invalid_json")
    param = loc_to_param(first.get("loc", ()))
    if prefix:
        param = prefix + ("." + param if param and not param.startswith("[") else (param or ""))
    msg = first.get("msg", "invalid value")
    extra = f" ({len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    return APIError(400, f"{param or 'body'}: {msg}{extra}", param, "invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_req: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc.errors()).response()

    @app.exception_handler(ValidationError)
    async def _pydantic(_req: Request, exc: ValidationError) -> JSONResponse:
        return validation_error(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err = APIError(404, f"Invalid URL ({req.method} {req.url.path})", None, "not_found")
        elif exc.status_code == 405:
            err = APIError(405, f"Method {req.method} not allowed for {req.url.path}", None,
                           "method_not_allowed")
        else:
            err = APIError(exc.status_code, str(exc.detail), None, None)
        return JSONResponse(err.body(), status_code=err.status, headers=exc.headers)

    @app.exception_handler(ValueError)
    async def _value(_req: Request, exc: ValueError) -> JSONResponse:
        return from_value_error(exc).response()

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", req.method, req.url.path)
        return APIError(500, f"internal server error: {type(exc).__name__}: {exc}").response()
