"""Request bodies of the OpenAI-compatible endpoints (pydantic, strict types).

Types are strict (``"5"`` is not an int, ``1`` is not a bool); unknown fields are ignored, as
OpenAI clients send fields a local server need not know (``user``, ``store``, ...). Each field's
JSON schema (in ``/openapi.json``) is what the server accepts: ranges are pydantic constraints
(derived from :mod:`agentlang.runtime.sampling.fields`, the table the engine's
:class:`SamplingParams` checks with), and fields whose JSON type is a union
(``prompt``, ``stop``, ``tool_choice``, message ``content``) are ``Any`` for validation, checked
where they are used with messages naming the field, and documented with their real shape
(``WithJsonSchema``). A token id is documented as ``TOKEN_ID`` (an integer >= 0, marked so that
the OpenAPI builder, :mod:`agentlang.runtime.server.openapi`, bounds it by the served model's vocabulary).
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from agentlang.runtime.sampling.fields import pydantic_bounds
from agentlang.runtime.server.errors import APIError, validation_error

M = TypeVar("M", bound=BaseModel)

TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
ROLES = ("system", "developer", "user", "assistant", "tool")
TOKEN_ID_MARK = "x-token-id"   # the OpenAPI builder bounds such an integer by the vocabulary
TOKEN_ID = {"type": "integer", "minimum": 0, TOKEN_ID_MARK: True}
NON_EMPTY_TEXT = {"type": "string", "minLength": 1}
TEXT_PART = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
STOP_SCHEMA = {"anyOf": [NON_EMPTY_TEXT, {"type": "array", "items": NON_EMPTY_TEXT},
                         {"type": "null"}]}
TOKEN_IDS = {"type": "array", "minItems": 1, "items": TOKEN_ID}
TEXTS = {"type": "array", "minItems": 1, "items": NON_EMPTY_TEXT}


def documented(schema: dict) -> Any:
    """An ``Any`` field (validated where it is used) documented with ``schema``."""
    return Annotated[Any, WithJsonSchema(schema)]


def one_or_each(schema: dict, null_items: bool = True) -> Any:
    """One value for every prompt of a batch, a list with one per prompt (each may be null,
    the default, unless ``null_items`` is False), or null."""
    item = {"anyOf": [schema, {"type": "null"}]} if null_items else schema
    return documented({"anyOf": [schema, {"type": "array", "items": item}, {"type": "null"}]})


NULL_ONLY = documented({"type": "null"})      # not supported by this server: absent or null
TokenIdList = Annotated[list[int], WithJsonSchema({"type": "array", "items": TOKEN_ID})]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class ChatMessage(_Strict):
    role: str = Field(json_schema_extra={"enum": list(ROLES)})
    # str | list of {"type": "text", "text": str} | None (only an assistant turn with tool
    # calls may omit it)
    content: documented({"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART},
                                   {"type": "null"}]}) = None
    name: str | None = None
    tool_calls: list[dict] | None = None     # assistant turns that called tools
    tool_call_id: str | None = None          # role "tool": which call this answers


class FunctionDef(_Strict):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    parameters: dict | None = None           # a JSON schema of an object
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class JsonSchemaFormat(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Strict):
    include_usage: bool | None = None


TopLogprobs = Annotated[int | None, Field(**pydantic_bounds("logprobs"))]


class SamplingFields(_Strict):
    """Fields shared by chat and text completions (OpenAI + the vLLM/SGLang extras)."""

    model: str | None = None
    max_tokens: int | None = Field(None, **pydantic_bounds("max_tokens"))
    temperature: float | None = Field(None, **pydantic_bounds("temperature"))
    top_p: float | None = Field(None, **pydantic_bounds("top_p"))
    n: int | None = Field(None, **pydantic_bounds("n"))
    stop: documented(STOP_SCHEMA) = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, **pydantic_bounds("presence_penalty"))
    frequency_penalty: float | None = Field(None, **pydantic_bounds("frequency_penalty"))
    logit_bias: dict | None = Field(None, max_length=0)  # not supported: absent or empty
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    # extras, as vLLM / SGLang accept them
    top_k: int | None = Field(None, **pydantic_bounds("top_k"))
    min_p: float | None = Field(None, **pydantic_bounds("min_p"))
    repetition_penalty: float | None = Field(None, **pydantic_bounds("repetition_penalty"))
    regex: str | None = None
    choices: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(None, **pydantic_bounds("min_tokens"))
    cache_salt: str | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    priority: int | None = None              # as vLLM / SGLang: scheduling priority
    agent: str | None = None                 # agentlang: per-agent accounting label
    speculative: bool | None = None          # agentlang: drafts from the context (None: server's)
    session_id: str | None = Field(None, min_length=1, max_length=256)   # also X-Session-ID
    next_use_s: float | None = Field(None, **pydantic_bounds("next_use_s"))  # agentlang: hint


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, **pydantic_bounds("max_tokens"))
    logprobs: bool | None = None
    top_logprobs: TopLogprobs = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(None, min_length=1)
    # "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    tool_choice: documented({"anyOf": [
        {"type": "string", "enum": ["none", "auto", "required"]},
        {"type": "object", "required": ["type", "function"], "properties": {
            "type": {"const": "function"},
            "function": {"type": "object", "required": ["name"],
                         "properties": {"name": {"type": "string"}}}}},
        {"type": "null"}]}) = None
    parallel_tool_calls: bool | None = None
    # vLLM's and SGLang's: keywords for the model's chat template (e.g. enable_thinking)
    chat_template_kwargs: dict | None = None


MAX_PROMPTS = 256
PROMPT_SCHEMA = {"anyOf": [
    NON_EMPTY_TEXT,
    {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": NON_EMPTY_TEXT},
    TOKEN_IDS,
    {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": TOKEN_IDS}]}


class CompletionRequest(SamplingFields):
    # str | list[str] | list[int] | list[list[int]] (at most MAX_PROMPTS prompts)
    prompt: documented(PROMPT_SCHEMA)
    logprobs: TopLogprobs = None
    echo: bool | None = None
    suffix: str | None = Field(None, max_length=0)       # not supported: absent or empty
    best_of: int | None = Field(None, **pydantic_bounds("n"))       # must equal n
    response_format: ResponseFormat | None = None


def _json_number(text: str) -> int | float:
    """A JSON number written with a fraction or an exponent: an ``int`` when it is integral
    (JSON and JSON Schema's ``integer`` make ``3.0`` and ``3`` the same number, so a count or a
    token id may come as ``3.0``); ``ValueError`` when it overflows a double."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return int(value) if value.is_integer() else value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes | str) -> Any:
    """Standard JSON (no ``NaN``/``Infinity``), integral numbers as ``int`` (see
    :func:`_json_number`); ``ValueError`` (``json.JSONDecodeError`` included) otherwise."""
    return json.loads(raw, parse_float=_json_number, parse_constant=_no_constant)


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body validated as ``model``; 400 (OpenAI error) for bad JSON or a bad field."""
    raw = await request.body()
    try:
        data = parse_json(raw)
    except ValueError as e:       # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise APIError(400, f"request body is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(data).__name__}",
                       None, "invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors()) from None
