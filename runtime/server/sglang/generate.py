"""SGLang's ``POST /generate`` (0.5.23 protocol).

Request (SGLang's ``GenerateReqInput``): ``text`` (str or list) or ``input_ids`` (list or list
of lists); ``sampling_params`` (a dict broadcast to every prompt, or one per prompt; checked by
:mod:`agentlang.runtime.server.sglang.params`); ``rid`` (str, or one per prompt; a single string in a
batch becomes ``rid_i``); ``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``
(scalar or one per prompt); ``return_text_in_logprobs``; ``stream``; ``cache_salt`` (a
prefix-cache namespace: prompts with different salts never share cached pages);
``session_params`` / ``session_id`` (:mod:`agentlang.runtime.server.sglang.sessions`). Unknown top-level keys are
ignored, as SGLang ignores them; agentlang's extensions are top-level: ``lark_grammar`` (a
Lark grammar constraining the output; it excludes the ``sampling_params`` constraints),
``priority``, ``agent``, ``program`` and ``next_use_s`` (seconds until a session turn's
continuation: a next-use hint, :mod:`agentlang.runtime.engine.sessions`). Every element is checked before anything is queued: one bad
element is a 400 for the whole batch.

Response: ``{"text", "output_ids", "meta_info"}`` for one prompt with ``n == 1``, else a list
(prompt-major, each with ``index``). ``meta_info``: ``id``, ``finish_reason`` (``null`` or
``{"type": "length", "length": N}`` / ``{"type": "stop", "matched": str|int}`` /
``{"type": "abort", "message"}``), ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
``e2e_latency``; with ``return_logprob``: ``input_token_logprobs`` (``[logprob, token_id,
text]`` from ``logprob_start_len`` on, the first logprob null; ``[]`` when the start is -1),
``output_token_logprobs``, and with ``top_logprobs_num`` the ``output_top_logprobs`` lists
(``input_top_logprobs`` is ``[]``: a start with top logprobs is answered 400). ``text`` in a
triple is null unless ``return_text_in_logprobs``.

``max_new_tokens: 0`` is prefill only: the prompt's KV enters the radix cache (later requests
report it as ``cached_tokens``), a constraint is compiled and checked but not applied, and the
answer has ``text ""``, ``output_ids []`` and ``finish_reason {"type": "length", "length": 0}``.
The engine runs it as a one-token request whose token is dropped.

Streaming: SSE events, each a full response object with the cumulative ``text``,
``output_ids`` (and ``output_token_logprobs``), the last one per completion with its final
``meta_info``; then ``data: [DONE]``. A failure after the status line is an ``{"error"}`` event.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from agentlang.runtime.server.errors import bad_request
from agentlang.runtime.server.logprobs import native_logprobs
from agentlang.runtime.server.sglang.routes import prompt_ids
from agentlang.runtime.server.sglang.sessions import join_session
from agentlang.runtime.server.sglang.output import Item, completions, result
from agentlang.runtime.server.sglang.params import (SCHEMA as SAMPLING_SCHEMA, NativeParamError,
                                          engine_field_names, parse_sampling)
from agentlang.runtime.server.openai.common import check_output
from agentlang.runtime.server.openapi import SESSION_ERRORS, STREAMED, json_body
from agentlang.runtime.server.protocol import NON_EMPTY_TEXT, NULL_ONLY, TEXTS, TOKEN_IDS, _Strict, \
    documented, one_or_each, parse_body
from agentlang.runtime.server.state import ServerState
from agentlang.runtime.server.streaming import DONE, SSE_HEADERS, error_event, merge_streams, sse, \
    until_disconnect

router = APIRouter()
_CONSTRAINTS = ("json_schema", "regex")


class GenerateRequest(_Strict):
    text: documented({"anyOf": [NON_EMPTY_TEXT, TEXTS, {"type": "null"}]}) = None
    input_ids: documented({"anyOf": [TOKEN_IDS, {"type": "array", "minItems": 1,
                                                  "items": TOKEN_IDS}, {"type": "null"}]}) = None
    sampling_params: one_or_each(SAMPLING_SCHEMA) = None
    rid: one_or_each(NON_EMPTY_TEXT, null_items=False) = None
    return_logprob: one_or_each({"type": "boolean"}) = None
    logprob_start_len: one_or_each({"type": "integer", "minimum": -1}) = None
    top_logprobs_num: one_or_each({"type": "integer", "minimum": 0, "maximum": 20}) = None
    token_ids_logprob: NULL_ONLY = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    image_data: NULL_ONLY = None
    audio_data: NULL_ONLY = None
    video_data: NULL_ONLY = None
    lora_path: NULL_ONLY = None
    cache_salt: one_or_each(NON_EMPTY_TEXT) = None     # prefix-cache namespace (tenant)
    # agentlang's extension (SGLang's server ignores unknown top-level keys): a Lark grammar
    lark_grammar: str | None = None
    program: Any = None                   # optional DSL run/branch tag for the dashboard
    priority: Any = None                  # int | list[int]: higher first, as SGLang's
    agent: Any = None                     # str | list[str]: accounting label (agentlang's)
    session_params: Any = None            # SGLang's: continue a turn (sglang.sessions)
    session_id: Any = None                # SGLang's: keep the KV for this session
    next_use_s: Any = None                # agentlang's: seconds until the session continues


def _per_prompt(value: Any, count: int, single: bool, name: str) -> list[Any]:
    """A scalar broadcast to every prompt, or a list with one value per prompt."""
    if isinstance(value, list) and not single:
        if len(value) != count:
            raise bad_request(f"{name}: got {len(value)} values for {count} prompts", name)
        return list(value)
    return [value] * count


def _check_type(value: Any, ok: bool, name: str, what: str) -> None:
    if not ok:
        raise bad_request(f"{name}: must be {what}, got {value!r}", name)


def _rids(req: GenerateRequest, count: int, single: bool) -> list[str]:
    rid = req.rid
    if rid is None:
        base = uuid.uuid4().hex
        return [base] if single else [f"{base}_{i}" for i in range(count)]
    if isinstance(rid, str) and rid:
        return [rid] if single else [f"{rid}_{i}" for i in range(count)]
    if not single and isinstance(rid, list) and len(rid) == count and all(
            isinstance(r, str) and r for r in rid):
        return list(rid)
    raise bad_request(f"rid: must be a non-empty string{'' if single else ' or one per prompt'}"
                      f", got {rid!r}", "rid")


def _items(state: ServerState, req: GenerateRequest) -> tuple[bool, list[Item]]:
    for name in ("image_data", "audio_data", "video_data", "lora_path", "token_ids_logprob"):
        if getattr(req, name) is not None:
            raise bad_request(f"{name}: not supported by this server", name)
    single, prompts = prompt_ids(state, req.text, req.input_ids)
    prompt_field = "text" if req.text is not None else "input_ids"
    n = len(prompts)
    sps = _per_prompt(req.sampling_params, n, single and not isinstance(
        req.sampling_params, list), "sampling_params")
    lps = _per_prompt(req.return_logprob, n, single, "return_logprob")
    starts = _per_prompt(req.logprob_start_len, n, single, "logprob_start_len")
    tops = _per_prompt(req.top_logprobs_num, n, single, "top_logprobs_num")
    salts = _per_prompt(req.cache_salt, n, single, "cache_salt")
    priorities = _per_prompt(req.priority, n, single, "priority")
    agents = _per_prompt(req.agent, n, single, "agent")
    next_uses = _per_prompt(req.next_use_s, n, single, "next_use_s")
    items = []
    for i, ids in enumerate(prompts):
        at = "" if single else f"[{i}]"
        where = "sampling_params" + (f"[{i}]" if isinstance(req.sampling_params, list) else "")
        lp, start, top = lps[i], starts[i], tops[i]
        lp = False if lp is None else lp
        start = -1 if start is None else start
        top = 0 if top is None else top
        _check_type(lp, isinstance(lp, bool), f"return_logprob{at}", "a boolean")
        _check_type(start, isinstance(start, int) and not isinstance(start, bool)
                    and -1 <= start <= len(ids), f"logprob_start_len{at}",
                    f"-1 or an integer in [0, {len(ids)}] (the prompt's tokens)")
        _check_type(top, isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= 20,
                    f"top_logprobs_num{at}", "an integer in [0, 20]")
        if lp and top and start >= 0:
            raise bad_request(f"top_logprobs_num{at}: top logprobs of input tokens are not "
                              "supported; send logprob_start_len -1 with top_logprobs_num",
                              f"top_logprobs_num{at}")
        try:
            sampling = parse_sampling(sps[i], where, state.engine.limits)
        except NativeParamError as e:
            raise bad_request(str(e), e.field) from None
        fields = dict(sampling.fields)
        constraint = {k: fields[k] for k in _CONSTRAINTS if fields[k] is not None}
        if req.lark_grammar is not None:
            if constraint:
                raise bad_request(f"lark_grammar: only one output constraint may be given, got "
                                  f"{where}.{next(iter(constraint))} too", "lark_grammar")
            fields["grammar"] = req.lark_grammar
            constraint = {"grammar": req.lark_grammar}
        max_new = state.max_tokens_for(len(ids), fields["max_tokens"],
                                       f"{where}.max_new_tokens", prompt_field + at)
        if sampling.prefill_only:     # the engine's prefill_only: nothing sampled, the
            del fields["max_tokens"], fields["min_tokens"]   # constraint checked, not applied
            fields.update(n=1, complete_within_budget=False)
        else:
            fields["max_tokens"] = max_new
        _check_type(salts[i], salts[i] is None or isinstance(salts[i], str) and salts[i],
                    f"cache_salt{at}", "a non-empty string")
        fields["cache_salt"] = salts[i]
        if lp:
            fields["logprobs"] = top
            if start >= 0:
                fields["prompt_logprobs"] = 0
        fields.update(priority=priorities[i], agent=agents[i], next_use_s=next_uses[i])
        params = state.sampling_params(
            fields, engine_field_names(where) | {k: f"{k}{at}" for k in
                                                 ("priority", "agent", "next_use_s")}, where)
        items.append(Item(ids, "", sampling, params, constraint, lp, start, top))
    for item, rid in zip(items, _rids(req, n, single)):
        item.rid = rid
    return single, items


async def _check_constraints(state: ServerState, items: list[Item]) -> None:
    """Compile each constraint (prefill-only ones too: checked, then not applied) on the
    params submitted, so it is normalised once."""
    for item in items:
        if item.constraint:
            prefix = "" if "grammar" in item.constraint else "sampling_params."
            await state.compile_constraint(item.params, "lark_grammar" if not prefix else None,
                                           prefix, "sampling_params.max_new_tokens")


def _engine_fields(req: GenerateRequest) -> dict[str, str]:
    """Engine field → request field, for typed engine errors."""
    return {"prompt": "text" if req.text is not None else "input_ids",
            "grammar": "lark_grammar", "json_schema": "sampling_params.json_schema",
            "regex": "sampling_params.regex"}


@router.post("/generate", responses=STREAMED | SESSION_ERRORS,
             openapi_extra=json_body(GenerateRequest))
async def generate(request: Request):
    state: ServerState = request.app.state.server
    req = await parse_body(request, GenerateRequest)
    single, items = _items(state, req)
    await _check_constraints(state, items)
    dup = [it.rid for it in items if it.rid in state.native_rids]
    if dup or len({it.rid for it in items}) < len(items):
        raise bad_request(f"rid: duplicate request id {(dup or [items[0].rid])[0]!r}", "rid")
    join_session(state, req.session_params, req.session_id, items)
    if req.program is not None:
        request.app.state.dashboard.programs.record(req.program, [it.rid for it in items])
    many = not single or items[0].sampling.fields["n"] > 1
    if req.stream:
        return StreamingResponse(_stream(state, req, items, many),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    state.native_rids.update(it.rid for it in items)
    try:
        work = asyncio.gather(*[state.engine.async_generate(it.ids, it.params, it.rid,
                                                            it.sampling.prefill_only)
                                for it in items])
        outs = await until_disconnect(request, work)
    finally:
        state.native_rids.difference_update(it.rid for it in items)
    for out in outs:
        state.metrics.observe("generate", out.meta, "error" if out.error else "ok")
    results = [result(state, req.return_text_in_logprobs, it, check_output(out, _engine_fields(req)), c, many)
               for it, out in zip(items, outs) for c in completions(it, out)]
    return results if many else results[0]


async def _stream(state: ServerState, req: GenerateRequest, items: list[Item],
                  many: bool) -> AsyncIterator[str]:
    texts: dict[tuple[int, int], str] = {}
    tokens: dict[tuple[int, int], list[int]] = {}
    lps: dict[tuple[int, int], list] = {}
    state.native_rids.update(it.rid for it in items)
    try:
        streams = [state.engine.async_stream(it.ids, it.params, it.rid, it.sampling.prefill_only)
                   for it in items]
        async for k, d in merge_streams(streams):
            item, key = items[k], (k, d.index)
            if d.output is not None:
                state.metrics.observe("generate", d.output.meta,
                                      "error" if d.output.error else "ok")
                out = check_output(d.output, _engine_fields(req))
                for c in completions(item, out):
                    yield sse(result(state, req.return_text_in_logprobs, item, out, c, many))
                continue
            if item.sampling.prefill_only or not (d.text or d.token_ids):
                continue
            texts[key] = texts.get(key, "") + d.text
            tokens[key] = tokens.get(key, []) + list(d.token_ids)
            lps[key] = lps.get(key, []) + list(d.logprobs or [])
            meta: dict[str, Any] = {"id": item.rid, "finish_reason": None,
                                    "prompt_tokens": len(item.ids),
                                    "completion_tokens": len(tokens[key])}
            if item.return_logprob:
                chosen, _ = native_logprobs(lps[key], state.tokens, 0)
                meta["output_token_logprobs"] = [
                    [lp, tid, t if req.return_text_in_logprobs else None]
                    for lp, tid, t in chosen]
            event: dict[str, Any] = {"text": texts[key], "output_ids": tokens[key],
                                     "meta_info": meta}
            if many:
                event["index"] = d.index
            yield sse(event)
    except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream
        yield error_event(e)
    finally:
        state.native_rids.difference_update(it.rid for it in items)
    yield DONE
