"""agentlang's own native routes: ``/score``, ``/cache_prefix``, ``/release_prefix``,
``/apply_chat_template``, ``/tokenize``, ``/detokenize``. SGLang's ``/generate`` is
:mod:`agentlang.runtime.server.sglang.generate`, its metadata routes :mod:`agentlang.runtime.server.sglang.info`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from agentlang.runtime.server.chat import normalize_messages
from agentlang.runtime.server.errors import bad_request, from_value_error
from agentlang.runtime.server.openapi import json_body
from agentlang.runtime.server.protocol import NON_EMPTY_TEXT, TOKEN_IDS, ChatMessage, TokenIdList, \
    _Strict, documented, parse_body
from agentlang.runtime.server.state import ServerState

router = APIRouter()


class ScoreRequest(_Strict):
    prefix: documented({"anyOf": [{"type": "string"}, TOKEN_IDS]})
    continuations: list[str] = Field(min_length=1)


class TextRequest(_Strict):
    # exactly one of text and input_ids
    text: documented({"anyOf": [NON_EMPTY_TEXT, {"type": "null"}]}) = None
    input_ids: documented({"anyOf": [TOKEN_IDS, {"type": "null"}]}) = None


class HandleRequest(_Strict):
    handle: documented({"type": "string"})   # a handle /cache_prefix returned


class ChatTemplateRequest(_Strict):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True


class TokenizeRequest(_Strict):
    text: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = True


class DetokenizeRequest(_Strict):
    tokens: TokenIdList
    skip_special_tokens: bool = False


def prompt_ids(state: ServerState, text: Any, input_ids: Any) -> tuple[bool, list[list[int]]]:
    """(single, token id lists) of a native request."""
    if (text is None) == (input_ids is None):
        raise bad_request("text: give exactly one of text and input_ids", "text")
    if text is not None:
        if isinstance(text, list) and text:
            return False, [state.encode_text(t, f"text[{i}]") for i, t in enumerate(text)]
        return True, [state.encode_text(text, "text")]
    if isinstance(input_ids, list) and input_ids and all(isinstance(x, list) for x in input_ids):
        return False, [state.check_ids(x, f"input_ids[{i}]") for i, x in enumerate(input_ids)]
    return True, [state.check_ids(input_ids, "input_ids")]


@router.post("/score", openapi_extra=json_body(ScoreRequest))
async def score(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, ScoreRequest)
    prefix = req.prefix
    if not (isinstance(prefix, str) or isinstance(prefix, list)):
        raise bad_request("prefix: must be a string or a list of token ids", "prefix")
    if isinstance(prefix, list):
        prefix = state.check_ids(prefix, "prefix")
    try:
        logprobs = await asyncio.to_thread(state.engine.score, prefix, req.continuations)
    except ValueError as e:
        raise from_value_error(e) from None
    return {"logprobs": logprobs}


@router.post("/cache_prefix", openapi_extra=json_body(TextRequest))
async def cache_prefix(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, TextRequest)
    single, prompts = prompt_ids(state, req.text, req.input_ids)
    if not single:
        raise bad_request("text: one prefix per request", "text")
    state.max_tokens_for(len(prompts[0]), 1, "text", "text")
    handle = await asyncio.to_thread(state.engine.cache_prefix, prompts[0])
    return {"handle": state.add_prefix(handle), "tokens": len(handle.token_ids)}


@router.post("/release_prefix", openapi_extra=json_body(HandleRequest))
async def release_prefix(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, HandleRequest)
    handle = state.pop_prefix(req.handle)
    await asyncio.to_thread(state.engine.release_prefix, handle)
    return {"released": True}


@router.post("/apply_chat_template", openapi_extra=json_body(ChatTemplateRequest))
async def apply_chat_template(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, ChatTemplateRequest)
    messages = normalize_messages(req.messages)
    return {"text": state.engine.apply_chat_template(messages, req.add_generation_prompt)}


@router.post("/tokenize", openapi_extra=json_body(TokenizeRequest))
async def tokenize(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, TokenizeRequest)
    given = [k for k in ("text", "prompt", "messages") if getattr(req, k) is not None]
    if len(given) != 1:
        raise bad_request("text: give exactly one of text, prompt and messages", "text")
    if req.messages is not None:
        ids = state.chat_ids(normalize_messages(req.messages))
    else:
        ids = state.engine.tokenizer.encode(getattr(req, given[0]),
                                            add_special_tokens=req.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": state.token_limit}


@router.post("/detokenize", openapi_extra=json_body(DetokenizeRequest))
async def detokenize(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, DetokenizeRequest)
    if req.tokens:
        state.check_ids(req.tokens, "tokens")
    text = state.engine.tokenizer.decode(req.tokens, skip_special_tokens=req.skip_special_tokens)
    return {"text": text}
