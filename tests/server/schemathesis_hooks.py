"""schemathesis hooks of the OpenAPI check (``SCHEMATHESIS_HOOKS=schemathesis_hooks``): bound
the cost of each generated request so the run fits the test suite's time on a CPU.

Only values inside the documented range are lowered (an out-of-range value is kept, so a
negative case stays negative): at most ``MAX_NEW`` new tokens and ``MAX_N`` completions per
prompt; a request that leaves ``max_tokens`` out (chat: "up to the context") gets
``MAX_NEW``. Nothing else about the generated request changes.
"""

from __future__ import annotations

import schemathesis

MAX_NEW = 3
MAX_N = 2
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_new_tokens")
COUNT_FIELDS = ("n", "best_of")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def bound(params: dict, length_default: bool) -> None:
    """Lower in-range lengths and counts of one request (or ``sampling_params``) in place."""
    lengths = [k for k in LENGTH_FIELDS if k in params]
    for k in lengths:
        v = params[k]
        if _is_int(v) and v >= 1:
            floor = params.get("min_tokens", params.get("min_new_tokens"))
            keep_min = _is_int(floor) and 0 <= floor <= v
            params[k] = min(v, MAX_NEW)
            if keep_min:
                for m in ("min_tokens", "min_new_tokens"):
                    if m in params:
                        params[m] = min(params[m], params[k])
    if not lengths and length_default:
        params["max_tokens"] = MAX_NEW
        for m in ("min_tokens",):
            if _is_int(params.get(m)) and params[m] >= 0:
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
        bound(body, length_default=path == "/v1/chat/completions")
    sp = body.get("sampling_params")
    if isinstance(sp, dict):
        bound(sp, length_default=False)
    elif isinstance(sp, list):
        for one in sp:
            if isinstance(one, dict):
                bound(one, length_default=False)
