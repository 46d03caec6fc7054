"""Request bodies of the OpenAI-compatible endpoints (pydantic, strict types).

Types are strict (``"5"`` is not an int, ``1`` is not a bool); unknown fields are ignored, as
OpenAI clients send fields a local server need not know (``user``, ``store``, ...). Fields whose
JSON type is a union (``prompt``, ``stop``, ``tool_choice``, message ``content``) are ``Any`` here
and checked where they are used, with messages naming the field. Value ranges are checked by
:class:`runtime.SamplingParams`, which names the field in its ``ValueError``.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.server.errors import APIError, validation_error

M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class ChatMessage(_Strict):
    role: str
    content: Any = None                      # str | list of {"type": "text", "text": str} | None
    name: str | None = None
    tool_calls: list[dict] | None = None     # assistant turns that called tools
    tool_call_id: str | None = None          # role "tool": which call this answers


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: str
    function: FunctionDef


class JsonSchemaFormat(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: str
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Strict):
    include_usage: bool | None = None


class SamplingFields(_Strict):
    """Fields shared by chat and text completions (OpenAI + the vLLM/SGLang extras)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: Any = None                         # str | list[str]
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    # extras, as vLLM / SGLang accept them
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    regex: str | None = None
    choices: list[str] | None = None
    grammar: str | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    cache_salt: str | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    priority: int | None = None              # as vLLM / SGLang: scheduling priority
    agent: str | None = None                 # agentlang: per-agent accounting label


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None                  # "none" | "auto" | "required" | {"type", "function"}
    parallel_tool_calls: bool | None = None


class CompletionRequest(SamplingFields):
    prompt: Any = None                       # str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    response_format: ResponseFormat | None = None


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body validated as ``model``; 400 (OpenAI error) for bad JSON or a bad field."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"request body is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(data).__name__}",
                       None, "invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors()) from None
