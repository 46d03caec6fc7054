"""``POST /v1/completions`` (plain and streaming; one prompt or a batch) and ``GET /v1/models``.

Choice ``p * n + i`` is completion ``i`` of prompt ``p``. ``max_tokens`` defaults to 16, as in
OpenAI's legacy API. ``echo`` prepends the prompt text (not together with ``logprobs``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.server.errors import bad_request
from agentlang.runtime.server.logprobs import completion_logprobs
from agentlang.runtime.server.openai.common import (
    base_fields,
    take_session_header,
    check_output,
    constraint_fields,
    finish_reason,
    sum_usage,
)
from agentlang.runtime.server.openapi import SESSION_ERRORS, STREAMED, json_body
from agentlang.runtime.server.protocol import MAX_PROMPTS, CompletionRequest, parse_body
from agentlang.runtime.server.state import ServerState
from agentlang.runtime.server.streaming import DONE, SSE_HEADERS, error_event, merge_streams, sse, \
    until_disconnect

router = APIRouter()
DEFAULT_MAX_TOKENS = 16


@router.get("/v1/models")
async def list_models(request: Request):
    state: ServerState = request.app.state.server
    card = {"id": state.served_model_name, "object": "model", "created": state.created,
            "owned_by": "agentlang", "root": str(state.engine.model_path),
            "max_model_len": state.token_limit}
    return {"object": "list", "data": [card]}


@router.post("/v1/completions", responses=STREAMED | SESSION_ERRORS, openapi_extra=json_body(CompletionRequest))
async def completions(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, CompletionRequest)
    take_session_header(request, req)
    state.check_model(req.model)
    if req.suffix:
        raise bad_request("suffix: not supported by this server", "suffix")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise bad_request("best_of: only best_of == n is supported", "best_of")
    if req.echo and req.logprobs is not None:
        raise bad_request("echo: not supported together with logprobs", "echo")
    prompts = _prompts(state, req.prompt)
    constraint, cparam = constraint_fields(req)
    params = []
    for _text, ids in prompts:
        requested = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
        mt = state.max_tokens_for(len(ids), requested, "max_tokens", "prompt")
        fields = base_fields(req, mt) | constraint | {"logprobs": req.logprobs}
        params.append(state.sampling_params(fields, {"json_schema": cparam or "json_schema"}))
    for p, (_text, ids) in zip(params, prompts):
        state.engine.sessions.check(p, len(ids))
    await state.compile_constraint(params[0], cparam)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(
            _stream(state, prompts, params, rid, created, bool(req.echo), include_usage),
            media_type="text/event-stream", headers=SSE_HEADERS)
    engine = state.engine
    work = asyncio.gather(*[engine.async_generate(ids, p, f"{rid}-{k}")
                            for k, ((_, ids), p) in enumerate(zip(prompts, params))])
    outs = await until_disconnect(request, work)
    for out in outs:
        state.metrics.observe("completions", out.meta, "error" if out.error else "ok")
    choices = []
    for k, out in enumerate(outs):
        out = check_output(out)
        prefix = prompts[k][0] if req.echo else ""
        for c in out.outputs:
            lps = None
            if params[k].logprobs is not None and c.logprobs is not None:
                lps = completion_logprobs(c.logprobs, state.tokens, params[k].logprobs)
            choices.append({"index": k * params[k].n + c.index, "text": prefix + c.text,
                            "logprobs": lps, "finish_reason": finish_reason(c.finish_reason)})
    return JSONResponse({"id": rid, "object": "text_completion", "created": created,
                         "model": state.served_model_name, "choices": choices,
                         "usage": sum_usage([o.meta for o in outs]), "system_fingerprint": None})


def _prompts(state: ServerState, prompt: Any) -> list[tuple[str, list[int]]]:
    """``(text, token ids)`` per prompt; ``prompt`` is a string, a list of strings, a list of
    token ids or a list of token-id lists."""
    def one(p: Any, param: str) -> tuple[str, list[int]]:
        if isinstance(p, str):
            return p, state.encode_text(p, param)
        ids = state.check_ids(p, param)
        return state.engine.tokenizer.decode(ids), ids

    if prompt is None:
        raise bad_request("prompt: required", "prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                   and all(isinstance(t, int) for t in prompt)):
        return [one(prompt, "prompt")]
    if not isinstance(prompt, list) or not prompt:
        raise bad_request("prompt: must be a non-empty string, a list of strings, a list of "
                          "token ids or a list of token-id lists", "prompt")
    if len(prompt) > MAX_PROMPTS:
        raise bad_request(f"prompt: at most {MAX_PROMPTS} prompts per request, got {len(prompt)}",
                          "prompt")
    return [one(p, f"prompt[{i}]") for i, p in enumerate(prompt)]


async def _stream(state: ServerState, prompts: list[tuple[str, list[int]]],
                  params: list[SamplingParams], rid: str, created: int, echo: bool,
                  include_usage: bool) -> AsyncIterator[str]:
    base = {"id": rid, "object": "text_completion", "created": created,
            "model": state.served_model_name, "system_fingerprint": None}

    def chunk(index: int, text: str, reason: str | None = None, logprobs=None) -> str:
        d = dict(base, choices=[{"index": index, "text": text, "logprobs": logprobs,
                                 "finish_reason": reason}])
        if include_usage:
            d["usage"] = None
        return sse(d)

    engine = state.engine
    streams = [engine.async_stream(ids, p, f"{rid}-{k}")
               for k, ((_, ids), p) in enumerate(zip(prompts, params))]
    seen: set[int] = set()
    offsets: dict[int, int] = {}
    metas = []
    try:
        async for k, d in merge_streams(streams):
            p = params[k]
            index = k * p.n + d.index
            text = d.text
            if index not in seen:
                seen.add(index)
                if echo:
                    text = prompts[k][0] + text
            lps = None
            if p.logprobs is not None and d.logprobs:
                lps = completion_logprobs(d.logprobs, state.tokens, p.logprobs,
                                          offsets.get(index, 0))
            offsets[index] = offsets.get(index, 0) + len(text)
            if text or lps:
                yield chunk(index, text, logprobs=lps)
            if d.output is not None:
                state.metrics.observe("completions", d.output.meta,
                                      "error" if d.output.error else "ok")
                out = check_output(d.output)
                metas.append(out.meta)
                for c in out.outputs:
                    yield chunk(k * p.n + c.index, "", finish_reason(c.finish_reason))
        if include_usage:
            yield sse(dict(base, choices=[], usage=sum_usage(metas)))
    except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream
        yield error_event(e)
    yield DONE
