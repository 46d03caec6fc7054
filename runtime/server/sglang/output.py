"""The answer objects of SGLang's ``/generate``: ``{"text", "output_ids", "meta_info"}`` per
completion (see :mod:`agentlang.runtime.server.sglang.generate` for the fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentlang.runtime.request.outputs import CompletionOutput, RequestOutput
from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.server.logprobs import native_logprobs
from agentlang.runtime.server.sglang.params import NativeSampling
from agentlang.runtime.server.state import ServerState


@dataclass
class Item:
    """One prompt of a request, checked and ready to queue."""

    ids: list[int]
    rid: str
    sampling: NativeSampling
    params: SamplingParams           # what the engine runs (prefill only: nothing sampled)
    constraint: dict[str, Any]       # the output constraint as engine fields ({} if none)
    return_logprob: bool
    start: int                       # logprob_start_len (-1: no input logprobs)
    top: int


def _triple(state: ServerState, lp: float | None, tid: int, with_text: bool) -> list:
    return [lp, tid, state.tokens.text(tid) if with_text else None]


def meta_info(state: ServerState, with_text: bool, item: Item, out: RequestOutput,
              c: CompletionOutput) -> dict:
    """``meta_info`` of completion ``c``; ``with_text``: ``return_text_in_logprobs``."""
    m = out.meta
    finish: dict | None
    if c.finish_reason is None:
        finish = None
    elif c.finish_reason == "length":
        finish = {"type": "length", "length": len(c.token_ids)}
    elif c.finish_reason == "abort":
        finish = {"type": "abort", "message": "aborted"}
    else:
        finish = {"type": c.finish_reason, "matched": c.matched_stop}
    meta: dict[str, Any] = {
        "id": item.rid, "finish_reason": finish, "prompt_tokens": len(item.ids),
        "weight_version": "default", "completion_tokens": len(c.token_ids),
        "cached_tokens": m.get("cached_tokens", 0), "reasoning_tokens": 0,
        "num_retractions": 0, "e2e_latency": m.get("latency_s"),
    }
    if m.get("spec_verify_ct"):          # as SGLang reports speculative decoding, plus the counts
        meta.update({k: m[k] for k in ("spec_verify_ct", "spec_draft_tokens",
                                       "spec_accepted_tokens")})
    if item.return_logprob:
        ids, plp = item.ids, out.prompt_logprobs or [None] * len(item.ids)
        meta["input_token_logprobs"] = [] if item.start < 0 else [
            _triple(state, None if p == item.start else plp[p], ids[p], with_text)
            for p in range(item.start, len(ids))]
        chosen, top = native_logprobs(c.logprobs or [], state.tokens, item.top)
        if not with_text:
            chosen = [[lp, tid, None] for lp, tid, _ in chosen]
            top = None if top is None else [[[a, t, None] for a, t, _ in pos] for pos in top]
        meta["output_token_logprobs"] = chosen
        meta["output_token_logprobs_length"] = len(chosen)
        if item.top:
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = top
    return meta


def result(state: ServerState, with_text: bool, item: Item, out: RequestOutput,
           c: CompletionOutput, many: bool) -> dict:
    r = {"text": c.text, "output_ids": list(c.token_ids),
         "meta_info": meta_info(state, with_text, item, out, c)}
    if many:
        r["index"] = c.index
    return r


def completions(item: Item, out: RequestOutput) -> list[CompletionOutput]:
    if item.sampling.prefill_only:     # n results of one prefill (the engine's: finish "length")
        return [CompletionOutput(k, "", [], "length") for k in range(item.sampling.fields["n"])]
    return out.outputs
