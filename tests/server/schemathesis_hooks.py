"""schemathesis hooks of the OpenAPI check (``SCHEMATHESIS_HOOKS=schemathesis_hooks``): bound
the cost of each generated request so the run fits the test suite's time on a CPU.

Only values inside the documented range are lowered (an out-of-range value is kept, so a
negative case stays negative): at most ``MAX_NEW`` new tokens and ``MAX_N`` completions per
prompt; a chat request without ``max_tokens`` (up to the context) and a ``/generate`` one
without ``max_new_tokens`` (128, or up to the context when null) get ``MAX_NEW``, and
``min_tokens`` / ``min_new_tokens`` stay within the new length. Nothing else changes.
"""

from __future__ import annotations

import schemathesis

MAX_NEW = 3
MAX_N = 2
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_new_tokens")
COUNT_FIELDS = ("n", "best_of")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def bound(params: dict, default_key: str | None) -> None:
    """Lower in-range lengths and counts of one request (or ``sampling_params``) in place;
    ``default_key``: the length field to set when no length is given (None: leave it)."""
    lengths = [k for k in LENGTH_FIELDS if k in params]
    floors = [m for m in ("min_tokens", "min_new_tokens") if _is_int(params.get(m))]
    for k in lengths:
        v = params[k]
        if _is_int(v) and v >= 1:
            params[k] = min(v, MAX_NEW)
            for m in floors:
                if 0 <= params[m] <= v:
                    params[m] = min(params[m], params[k])
    if (not lengths or all(params[k] is None for k in lengths)) and default_key is not None:
        params[default_key] = MAX_NEW
        for m in floors:
            if params[m] >= 0:
                params[m] = min(params[m], MAX_NEW)
    for k in COUNT_FIELDS:
        if _is_int(params.get(k)) and 1 <= params[k] <= 64:
            params[k] = min(params[k], MAX_N)
    for k in ("logprobs", "top_logprobs", "top_logprobs_num"):
        if _is_int(params.get(k)) and 0 <= params[k] <= 20:
            params[k] = min(params[k], 2)


@schemathesis.hook
def before_call(context, case, kwargs):
    body = case.body
    if not isinstance(body, dict):
        return
    path = case.operation.path
    if path.startswith("/v1/"):
        bound(body, "max_tokens" if path == "/v1/chat/completions" else None)
    if path == "/generate":
        sp = body.get("sampling_params")
        if sp is None:
            body["sampling_params"] = sp = {}
        for one in sp if isinstance(sp, list) else [sp]:
            if isinstance(one, dict):
                bound(one, "max_new_tokens")
