"""The server's OpenAPI document (``/openapi.json``), truthful to what the server answers.

Every route reads its body with :func:`agentlang.runtime.server.protocol.parse_body` (one parser, one
error shape) and declares it with ``openapi_extra=json_body(Model)``: the model's JSON schema
(what ``parse_body`` accepts) becomes the operation's required ``application/json`` body, the
model and the models it nests become ``components/schemas``. This module also adds what
FastAPI cannot know and removes what is not true of this server:

- every failure is the OpenAI error body (:class:`ErrorResponse`), never FastAPI's 422: the
  ``422`` entries and their ``HTTPValidationError`` schemas are dropped, and a ``400`` with
  :class:`ErrorResponse` is documented on every operation that takes a body; a ``401`` on
  every operation but the open ones when the server requires an API key;
- values that depend on the served model: a token id (an integer schema the request models
  mark with ``TOKEN_ID_MARK``) is in ``[0, vocab_size)``, and ``model`` is one of the names this server
  answers to (:attr:`ServerState.model_aliases`) or absent;
- streaming routes (``responses=STREAMED``) also answer ``text/event-stream``.

``install_openapi(app, state)`` replaces ``app.openapi``; the document is built once, on the
first request for it.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from agentlang.runtime.server.auth import OPEN_PATHS
from agentlang.runtime.server.protocol import TOKEN_ID_MARK
from agentlang.runtime.server.state import ServerState

STREAMED: dict[int | str, dict[str, Any]] = {200: {
    "description": "The result as JSON, or with `stream: true` server-sent events "
                   "(`data: {json}` lines, the last one `data: [DONE]`).",
    "content": {"text/event-stream": {}}}}
# What a session can answer besides 400 (agentlang.runtime.server.sglang.sessions).
SESSION_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "No open session with that id (in this `cache_salt`)."},
    413: {"description": "The turn is over its session's capacity (`capacity_of_str_len`)."},
    429: {"description": "The server's limit of open sessions is reached."},
}
_FASTAPI_ONLY = ("HTTPValidationError", "ValidationError")
_REF = "#/components/schemas/"
_METHODS = ("get", "post", "put", "delete", "patch")


def json_body(model: type[BaseModel]) -> dict:
    """``openapi_extra`` of a route whose body ``parse_body(request, model)`` reads."""
    schema = model.model_json_schema(ref_template=_REF + "{model}")
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}


def _hoist_body(op: dict, schemas: dict) -> None:
    """Move an inline body schema (and its ``$defs``) into the components, as a ``$ref``."""
    content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
    schema = content.get("schema")
    if not schema or "$ref" in schema or "title" not in schema:
        return
    schemas.update(schema.pop("$defs", {}))
    schemas[schema["title"]] = schema
    content["schema"] = {"$ref": _REF + schema["title"]}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The body of every 4xx/5xx answer: ``{"error": {"message", "type", "param", "code"}}``
    (``param`` names the request field at fault, e.g. ``messages[0].role``)."""

    error: ErrorDetail


def _error(description: str) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": {
                "$ref": _REF + "ErrorResponse"}}}}


def _fix_operation(path: str, op: dict, api_key: bool) -> None:
    responses = op.setdefault("responses", {})
    responses.pop("422", None)
    if "requestBody" in op or op.get("parameters"):
        responses["400"] = _error("Bad request: invalid JSON, a field of the wrong type or out "
                                  "of range, or a request the model cannot serve; `param` "
                                  "names the field.")
    for code in ("404", "413", "429"):       # documented by a route: give them the error body
        if code in responses and "content" not in responses[code]:
            responses[code] = _error(responses[code]["description"])
    if api_key and path not in OPEN_PATHS:
        responses["401"] = _error("Missing or wrong `Authorization: Bearer <key>`.")


def _bound_token_ids(node: Any, vocab: int) -> None:
    if isinstance(node, dict):
        if node.pop(TOKEN_ID_MARK, False):
            node["maximum"] = vocab - 1
            node["description"] = f"A token id of the served model (vocabulary {vocab})."
        for v in node.values():
            _bound_token_ids(v, vocab)
    elif isinstance(node, list):
        for v in node:
            _bound_token_ids(v, vocab)


def _per_server(schemas: dict, state: ServerState) -> None:
    _bound_token_ids(schemas, state.engine.model_config.vocab_size)
    names = sorted(n for n in state.model_aliases if n)
    for schema in schemas.values():
        model = schema.get("properties", {}).get("model")
        if model is not None and model.get("anyOf") == [{"type": "string"}, {"type": "null"}]:
            model["anyOf"] = [{"type": "string", "enum": names}, {"type": "null"}]
            model["description"] = "A name this server answers to (optional)."


def _operations(doc: dict):
    """``(path, operation)`` pairs of an OpenAPI document."""
    for path, item in doc.get("paths", {}).items():
        for method in _METHODS:
            if method in item:
                yield path, item[method]


def build_openapi(app: FastAPI, state: ServerState) -> dict:
    """The OpenAPI document of ``app`` served over ``state`` (see the module docstring)."""
    # a copy: the route declarations' schemas are shared, and this function edits the document
    doc = copy.deepcopy(get_openapi(title=app.title, version=app.version, routes=app.routes))
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_ONLY:
        schemas.pop(name, None)
    for path, op in _operations(doc):
        _hoist_body(op, schemas)
        _fix_operation(path, op, state.api_key is not None)
    errors = ErrorResponse.model_json_schema(ref_template=_REF + "{model}")
    schemas.update(errors.pop("$defs", {}))
    schemas["ErrorResponse"] = errors
    _per_server(schemas, state)
    return doc


def install_openapi(app: FastAPI, state: ServerState) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, state)
        return app.openapi_schema

    app.openapi = openapi
