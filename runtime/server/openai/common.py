"""What the chat and text completion endpoints share: request → SamplingParams fields,
constraints from ``response_format`` / tools / the regex-choices-grammar extras, usage, and
turning engine failures into errors."""

from __future__ import annotations

from typing import Any

from agentlang.runtime.request.outputs import RequestOutput
from agentlang.runtime.server.errors import APIError, bad_request, engine_error
from agentlang.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from agentlang.runtime.server.tools import ToolPlan

PERMISSIVE_JSON_OBJECT = {"type": "object"}


def base_fields(req: SamplingFields, max_tokens: int) -> dict[str, Any]:
    """SamplingParams fields common to both endpoints (``None`` = the engine default)."""
    if req.logit_bias:
        raise bad_request("logit_bias: not supported by this server", "logit_bias")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options: only allowed when stream is true", "stream_options")
    return {
        "max_tokens": max_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "n": req.n, "stop": req.stop, "seed": req.seed,
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "top_k": req.top_k, "min_p": req.min_p, "repetition_penalty": req.repetition_penalty,
        "ignore_eos": req.ignore_eos, "min_tokens": req.min_tokens, "cache_salt": req.cache_salt,
        "stop_token_ids": req.stop_token_ids, "skip_special_tokens": req.skip_special_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "priority": req.priority, "agent": req.agent, "speculative": req.speculative,
        "session": req.session_id, "next_use_s": req.next_use_s,
    }


def take_session_header(request: Any, req: SamplingFields) -> None:
    """An ``X-Session-ID`` header is the request's ``session_id`` (400 if both disagree)."""
    header = request.headers.get("x-session-id")
    if header is None:
        return
    if not header or len(header) > 256:
        raise bad_request("X-Session-ID: must be 1 to 256 characters", "X-Session-ID")
    if req.session_id is not None and req.session_id != header:
        raise bad_request(f"session_id: {req.session_id!r} differs from the X-Session-ID "
                          f"header {header!r}", "session_id")
    req.session_id = header


def constraint_fields(req: ChatCompletionRequest | CompletionRequest,
                      plan: ToolPlan | None = None,
                      constrain_auto_calls: bool = False) -> tuple[dict[str, Any], str | None]:
    """The one output constraint of the request as SamplingParams fields, and the request field
    it came from (for error messages). Raises 400 when two are given. With
    ``constrain_auto_calls`` (the xgrammar backend), ``tool_choice="auto"`` without another
    constraint becomes a ``tool_calls`` constraint: free text, but every started call valid."""
    sources: list[tuple[str, dict[str, Any]]] = []
    rf = req.response_format
    if rf is not None:
        if rf.type == "json_object":
            sources.append(("response_format", {"json_schema": PERMISSIVE_JSON_OBJECT}))
        elif rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise bad_request("response_format.json_schema.schema: required when type is "
                                  '"json_schema"', "response_format.json_schema.schema")
            sources.append(("response_format", {"json_schema": rf.json_schema.schema_}))
        elif rf.type != "text":
            raise bad_request('response_format.type: must be "text", "json_object" or '
                              f'"json_schema", got {rf.type!r}', "response_format.type")
    for name in ("regex", "choices", "grammar"):
        if getattr(req, name) is not None:
            sources.append((name, {name: getattr(req, name)}))
    if plan is not None and plan.enforced:
        sources.append(("tool_choice", plan.constraint()))
    elif constrain_auto_calls and plan is not None and plan.active and not sources:
        # tool_choice="auto": free text, but a started call (its format's marker) is valid
        sources.append(("tools", plan.constraint()))
    if len(sources) > 1:
        names = [s[0] for s in sources]
        raise bad_request(f"{names[1]}: only one output constraint may be given, got "
                          f"{', '.join(names)}", names[1])
    if not sources:
        return {}, None
    param = sources[0][0]
    return sources[0][1], ("tools" if param == "tool_choice" else param)


def usage(meta: dict) -> dict:
    """OpenAI's usage object; speculative decoding's drafts, when there were any, as OpenAI
    reports predicted outputs (``completion_tokens_details``: accepted / rejected)."""
    prompt, completion = meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0)
    out = {"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens", 0)}}
    drafted, kept = meta.get("spec_draft_tokens", 0), meta.get("spec_accepted_tokens", 0)
    if drafted:
        out["completion_tokens_details"] = {"accepted_prediction_tokens": kept,
                                            "rejected_prediction_tokens": drafted - kept}
    return out


def sum_usage(metas: list[dict]) -> dict:
    total = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0,
             "spec_draft_tokens": 0, "spec_accepted_tokens": 0}
    for m in metas:
        for k in total:
            total[k] += m.get(k, 0)
    return usage(total)


def check_output(out: RequestOutput | None,
                 param_map: dict[str, str] | None = None) -> RequestOutput:
    """Raise the error a failed engine request stands for (its typed code picks the status,
    :data:`~agentlang.runtime.server.errors.ENGINE_ERROR_STATUS`); ``param_map`` renames engine fields
    to request fields."""
    if out is None:
        raise APIError(500, "the engine ended the request without an output")
    if out.error is not None:
        raise engine_error(out.error, param_map)
    return out


def finish_reason(reason: str | None) -> str | None:
    return "stop" if reason == "abort" else reason
