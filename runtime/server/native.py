"""The native API (SGLang-style): ``/generate``, ``/score``, ``/cache_prefix``,
``/release_prefix``, ``/apply_chat_template``, ``/tokenize``, ``/detokenize``.

``POST /generate`` takes ``text`` (a string or a list) or ``input_ids`` (a list or a list of
lists), ``sampling_params`` under the engine's field names (``max_new_tokens`` is accepted as
SGLang's name for ``max_tokens``), ``stream``, ``return_logprob``, ``top_logprobs_num`` and
``logprob_start_len``. One prompt with ``n == 1`` answers one object
``{"text", "output_ids", "meta_info"}``; a batch or ``n > 1`` answers a list (prompt-major).
Streaming (one prompt) sends SSE events with the cumulative ``text``/``output_ids`` of the
completion ``index``; the last event of each completion carries its full ``meta_info``; the
stream ends with ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from runtime.outputs import CompletionOutput, RequestOutput
from runtime.sampling_params import SamplingParams
from runtime.server.chat import normalize_messages
from runtime.server.errors import APIError, bad_request, from_value_error
from runtime.server.logprobs import native_logprobs
from runtime.server.openai_common import check_output
from runtime.server.protocol import ChatMessage, _Strict, parse_body
from runtime.server.state import ServerState
from runtime.server.streaming import DONE, SSE_HEADERS, error_event, merge_streams, sse, \
    until_disconnect

router = APIRouter()


class GenerateRequest(_Strict):
    text: Any = None
    input_ids: Any = None
    sampling_params: dict | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1


class ScoreRequest(_Strict):
    prefix: Any
    continuations: list[str]


class TextRequest(_Strict):
    text: Any = None
    input_ids: Any = None


class HandleRequest(_Strict):
    handle: Any


class ChatTemplateRequest(_Strict):
    messages: list[ChatMessage]
    add_generation_prompt: bool = True


class TokenizeRequest(_Strict):
    text: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(_Strict):
    tokens: list[int]
    skip_special_tokens: bool = False


def _prompt_ids(state: ServerState, text: Any, input_ids: Any) -> tuple[bool, list[list[int]]]:
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


def _params(state: ServerState, req: GenerateRequest, prompt_len: int) -> SamplingParams:
    sp = dict(req.sampling_params or {})
    if "max_new_tokens" in sp:
        if "max_tokens" in sp:
            raise bad_request("sampling_params: give max_tokens or max_new_tokens, not both",
                              "sampling_params.max_new_tokens")
        sp["max_tokens"] = sp.pop("max_new_tokens")
    if req.return_logprob:
        if req.top_logprobs_num < 0:
            raise bad_request("top_logprobs_num: must be >= 0", "top_logprobs_num")
        sp["logprobs"] = req.top_logprobs_num
    if req.logprob_start_len >= 0:
        sp["prompt_logprobs"] = 0
    state.max_tokens_for(prompt_len, sp.get("max_tokens", SamplingParams().max_tokens),
                         "sampling_params.max_tokens", "text")
    try:
        return SamplingParams(**sp)
    except ValueError as e:
        renames = {f.name: f"sampling_params.{f.name}" for f in dataclasses.fields(SamplingParams)}
        raise from_value_error(e, renames, "sampling_params") from None


def _meta(state: ServerState, req: GenerateRequest, out: RequestOutput,
          c: CompletionOutput, params: SamplingParams) -> dict:
    m = out.meta
    meta: dict[str, Any] = {
        "id": out.request_id, "prompt_tokens": m.get("prompt_tokens"),
        "completion_tokens": len(c.token_ids), "cached_tokens": m.get("cached_tokens"),
        "finish_reason": None if c.finish_reason is None else
        {"type": c.finish_reason, "matched": c.matched_stop},
        "e2e_latency": m.get("latency_s"), "ttft": m.get("ttft_s"),
    }
    if req.return_logprob and c.logprobs is not None:
        chosen, top = native_logprobs(c.logprobs, state.tokens, params.logprobs or 0)
        meta["output_token_logprobs"] = chosen
        meta["output_top_logprobs"] = top
    if req.logprob_start_len >= 0 and out.prompt_logprobs is not None:
        ids = out.prompt_token_ids
        meta["input_token_logprobs"] = [
            [out.prompt_logprobs[p], ids[p], state.tokens.text(ids[p])]
            for p in range(req.logprob_start_len, len(ids))]
    return meta


def _result(state, req, out: RequestOutput, c: CompletionOutput, params, many: bool) -> dict:
    r = {"text": c.text, "output_ids": list(c.token_ids),
         "meta_info": _meta(state, req, out, c, params)}
    if many:
        r["index"] = c.index
    return r


@router.post("/generate")
async def generate(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, GenerateRequest)
    single, prompts = _prompt_ids(state, req.text, req.input_ids)
    params = [_params(state, req, len(ids)) for ids in prompts]
    await state.compile_constraint(params[0], None, "sampling_params.",
                                   budget_param="sampling_params.max_new_tokens"
                                   if "max_new_tokens" in (req.sampling_params or {})
                                   else "sampling_params.max_tokens")
    rid = f"gen-{uuid.uuid4().hex}"
    if req.stream:
        if not single:
            raise bad_request("stream: a batch of prompts cannot be streamed; send one prompt "
                              "per request", "stream")
        return StreamingResponse(_stream(state, req, prompts[0], params[0], rid),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    work = asyncio.gather(*[state.engine.async_generate(ids, p, f"{rid}-{k}")
                            for k, (ids, p) in enumerate(zip(prompts, params))])
    outs = await until_disconnect(request, work)
    for out in outs:
        state.metrics.observe("generate", out.meta, "error" if out.error else "ok")
    many = not single or params[0].n > 1
    results = [_result(state, req, check_output(out), c, p, many)
               for out, p in zip(outs, params) for c in out.outputs]
    return results if many else results[0]


async def _stream(state: ServerState, req: GenerateRequest, ids: list[int],
                  params: SamplingParams, rid: str) -> AsyncIterator[str]:
    texts: dict[int, str] = {}
    tokens: dict[int, list[int]] = {}
    many = params.n > 1
    try:
        async for _, d in merge_streams([state.engine.async_stream(ids, params, rid)]):
            i = d.index
            texts[i] = texts.get(i, "") + d.text
            tokens[i] = tokens.get(i, []) + list(d.token_ids)
            if d.output is not None:
                state.metrics.observe("generate", d.output.meta,
                                      "error" if d.output.error else "ok")
                out = check_output(d.output)
                for c in out.outputs:
                    yield sse(_result(state, req, out, c, params, many))
            elif d.text or d.token_ids:
                event: dict[str, Any] = {"text": texts[i], "output_ids": tokens[i],
                                         "meta_info": {"id": rid, "prompt_tokens": len(ids),
                                                       "completion_tokens": len(tokens[i]),
                                                       "finish_reason": None}}
                if many:
                    event["index"] = i
                yield sse(event)
    except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream
        yield error_event(e)
    yield DONE


@router.post("/score")
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


@router.post("/cache_prefix")
async def cache_prefix(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, TextRequest)
    single, prompts = _prompt_ids(state, req.text, req.input_ids)
    if not single:
        raise bad_request("text: one prefix per request", "text")
    state.max_tokens_for(len(prompts[0]), 1, "text", "text")
    handle = await asyncio.to_thread(state.engine.cache_prefix, prompts[0])
    return {"handle": state.add_prefix(handle), "tokens": len(handle.token_ids)}


@router.post("/release_prefix")
async def release_prefix(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, HandleRequest)
    handle = state.pop_prefix(req.handle)
    await asyncio.to_thread(state.engine.release_prefix, handle)
    return {"released": True}


@router.post("/apply_chat_template")
async def apply_chat_template(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, ChatTemplateRequest)
    messages = normalize_messages(req.messages)
    return {"text": state.engine.apply_chat_template(messages, req.add_generation_prompt)}


@router.post("/tokenize")
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


@router.post("/detokenize")
async def detokenize(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, DetokenizeRequest)
    vocab = state.engine.model_config.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"tokens: ids must be in [0, {vocab}), got {bad[:3]}", "tokens")
    text = state.engine.tokenizer.decode(req.tokens, skip_special_tokens=req.skip_special_tokens)
    return {"text": text}
