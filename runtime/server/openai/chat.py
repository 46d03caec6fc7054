"""``POST /v1/chat/completions`` (plain and streaming).

Tools are written and parsed in the model family's format (``state.family``, see
:mod:`agentlang.runtime.server.tools`); a model that thinks (Qwen3's ``<think>``, on unless
``chat_template_kwargs`` sets ``enable_thinking`` false) has its reasoning block split into
``message.reasoning_content`` (streamed as ``delta.reasoning_content``), and a response format
or tool constraint applies to the answer after the block, not to the block."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentlang.runtime.chat.reasoning import ReasoningSplit
from agentlang.runtime.grammar.tool_format import FORMATS
from agentlang.runtime.request.outputs import RequestOutput
from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.server.chat import normalize_messages, with_tool_prompt
from agentlang.runtime.server.errors import bad_request
from agentlang.runtime.server.logprobs import chat_logprobs
from agentlang.runtime.server.openai.common import (
    base_fields,
    take_session_header,
    check_output,
    constraint_fields,
    finish_reason,
    usage,
)
from agentlang.runtime.server.openapi import SESSION_ERRORS, STREAMED, json_body
from agentlang.runtime.server.protocol import ChatCompletionRequest, parse_body
from agentlang.runtime.server.state import ServerState
from agentlang.runtime.server.streaming import DONE, SSE_HEADERS, error_event, merge_streams, sse, \
    until_disconnect
from agentlang.runtime.server.tools import ToolPlan, plan_tools

router = APIRouter()


@router.post("/v1/chat/completions", responses=STREAMED | SESSION_ERRORS,
             openapi_extra=json_body(ChatCompletionRequest))
async def chat_completions(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, ChatCompletionRequest)
    take_session_header(request, req)
    state.check_model(req.model)
    family = state.family
    plan = plan_tools(req.tools, req.tool_choice, family.tool_format)
    kwargs = dict(req.chat_template_kwargs or {})
    if family.native_tools:
        messages = normalize_messages(req.messages, structured_calls=True)
        if plan.active:
            kwargs["tools"] = plan.template_tools()
    else:
        messages = with_tool_prompt(normalize_messages(req.messages), plan)
    ids = state.chat_ids(messages, **kwargs)
    reasoning = family.reasoning if family.thinking(req.chat_template_kwargs) else None
    params, cparam = _params(state, req, plan, len(ids), reasoning)
    state.engine.sessions.check(params, len(ids))
    await state.compile_constraint(params, cparam)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(
            _stream(state, plan, reasoning, ids, params, rid, created, include_usage),
            media_type="text/event-stream", headers=SSE_HEADERS)
    out = await until_disconnect(request, state.engine.async_generate(ids, params, rid))
    state.metrics.observe("chat", out.meta, "error" if out.error else "ok")
    out = check_output(out)
    choices = [_choice(state, plan, reasoning, c.index, c.text, c.finish_reason, c.logprobs, params)
               for c in out.outputs]
    return JSONResponse({"id": rid, "object": "chat.completion", "created": created,
                         "model": state.served_model_name, "choices": choices,
                         "usage": usage(out.meta), "system_fingerprint": None})


def _params(state: ServerState, req: ChatCompletionRequest, plan: ToolPlan,
            prompt_len: int, reasoning: str | None) -> tuple[SamplingParams, str | None]:
    mt_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    requested = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    max_tokens = state.max_tokens_for(prompt_len, requested, mt_param, "messages")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs: requires logprobs to be true", "top_logprobs")
    fields = base_fields(req, max_tokens)
    fields["logprobs"] = (req.top_logprobs or 0) if req.logprobs else None
    fmt = FORMATS[plan.format]
    if plan.active and fmt.stops:                 # the tool's turn ends the answer
        given = fields["stop"]
        fields["stop"] = [*([given] if isinstance(given, str) else given or ()), *fmt.stops]
    if plan.active and fmt.gemma:    # FunctionGemma's markers may be special tokens: kept in
        fields["skip_special_tokens"] = False     # the text for its parser (as vLLM does)
    constraint, cparam = constraint_fields(
        req, plan, constrain_auto_calls=state.engine.config.grammar_backend == "xgrammar")
    fields.update(constraint)
    if reasoning and ("json_schema" in constraint or "tool_calls" in constraint):
        fields["reasoning"] = reasoning         # constrain the answer after the block
    param_map = {"max_tokens": mt_param, "logprobs": "top_logprobs"}
    if cparam is not None:
        param_map.update(json_schema=cparam, json_indent=cparam)
    return state.sampling_params(fields, param_map), cparam


def _message(plan: ToolPlan, text: str, reason: str | None,
             thought: str | None = None) -> tuple[dict, str | None]:
    """The assistant message for answer ``text`` (tool calls parsed when tools are active;
    ``thought``: the reasoning block's text, when the model has one)."""
    extra = {} if thought is None else {"reasoning_content": thought}
    if plan.active:
        parsed = plan.parse(text)
        if parsed is not None:
            calls, content = parsed
            return {"role": "assistant", "content": content, **extra, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": text, **extra}, finish_reason(reason)


def _choice(state: ServerState, plan: ToolPlan, reasoning: str | None, index: int, text: str,
            reason: str | None, lps, params: SamplingParams) -> dict:
    thought = None
    if reasoning:
        thought, text = ReasoningSplit(reasoning).split(text)
    message, fr = _message(plan, text, reason, thought)
    logprobs = None
    if params.logprobs is not None and lps is not None:
        logprobs = chat_logprobs(lps, state.tokens, params.logprobs)
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": fr}


def _could_be_call(text: str, trigger: str) -> bool | None:
    """Whether streamed text may be a tool call (opened by ``trigger``): ``None`` while undecided."""
    s = text.lstrip()
    if not s or (trigger.startswith(s) and s != trigger):
        return None
    return s.startswith((trigger, "{", "```"))


async def _stream(state: ServerState, plan: ToolPlan, reasoning: str | None, ids: list[int],
                  params: SamplingParams, rid: str, created: int,
                  include_usage: bool) -> AsyncIterator[str]:
    base = {"id": rid, "object": "chat.completion.chunk", "created": created,
            "model": state.served_model_name, "system_fingerprint": None}

    def chunk(index: int, delta: dict, reason: str | None = None, logprobs=None) -> str:
        d = dict(base, choices=[{"index": index, "delta": delta, "logprobs": logprobs,
                                 "finish_reason": reason}])
        if include_usage:
            d["usage"] = None
        return sse(d)

    def lp(items) -> dict | None:
        if params.logprobs is None or not items:
            return None
        return chat_logprobs(items, state.tokens, params.logprobs)

    trigger = FORMATS[plan.format].trigger
    splits: dict[int, ReasoningSplit] = {}  # per choice: its reasoning block, split off
    held: dict[int, str] = {}          # text held back while it may be a tool call
    held_lps: dict[int, list] = {}
    hold: dict[int, bool | None] = {}  # per choice: True hold all, False stream, None undecided
    final: RequestOutput | None = None
    try:
        stream = state.engine.async_stream(ids, params, rid)
        async for _, d in merge_streams([stream]):
            i = d.index
            if i not in hold:
                hold[i] = True if plan.enforced else (None if plan.active else False)
                held[i], held_lps[i], splits[i] = "", [], ReasoningSplit(reasoning)
                yield chunk(i, {"role": "assistant", "content": ""})
            thought, text = splits[i].feed(d.text)
            if thought:
                yield chunk(i, {"reasoning_content": thought})
            if hold[i] is False:
                if text or d.logprobs:
                    yield chunk(i, {"content": text}, logprobs=lp(d.logprobs))
            else:
                held[i] += text
                held_lps[i] += d.logprobs or []
                if hold[i] is None:
                    hold[i] = _could_be_call(held[i], trigger)
                    if hold[i] is False:
                        yield chunk(i, {"content": held[i]}, logprobs=lp(held_lps[i]))
            if d.output is not None:
                final = d.output
        state.metrics.observe("chat", final.meta if final else {},
                              "error" if final is None or final.error else "ok")
        final = check_output(final)
        for c in final.outputs:
            i = c.index
            reason = finish_reason(c.finish_reason)
            thought, text = splits[i].flush() if i in splits else ("", "")
            if thought:
                yield chunk(i, {"reasoning_content": thought})
            if text and hold.get(i) is False:
                yield chunk(i, {"content": text})
            elif text:
                held[i] += text
            if hold.get(i) is not False:
                message, reason = _message(plan, held.get(i, ""), c.finish_reason)
                if "tool_calls" in message:
                    calls = [dict(call, index=k) for k, call in enumerate(message["tool_calls"])]
                    delta = {"content": message["content"], "tool_calls": calls}
                    yield chunk(i, delta)
                elif held.get(i):
                    yield chunk(i, {"content": held[i]}, logprobs=lp(held_lps[i]))
            yield chunk(i, {}, reason)
        if include_usage:
            yield sse(dict(base, choices=[], usage=usage(final.meta)))
    except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream
        yield error_event(e)
    yield DONE
