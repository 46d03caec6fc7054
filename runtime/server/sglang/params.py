"""SGLang's ``sampling_params`` object (0.5.23) → the engine's :class:`SamplingParams`.

Names, defaults and checks are SGLang's (its ``SamplingParams`` and ``verify``); a ``null``
value means the default, an unknown name is a 400, and every failure is a 400 naming
``sampling_params.<name>`` (``sampling_params[i].<name>`` for one element of a list).

Mapping: ``max_new_tokens`` → ``max_tokens`` (``0`` = prefill only, ``null`` = up to the
context), ``min_new_tokens`` → ``min_tokens``, ``sampling_seed`` → ``seed``, ``no_stop_trim`` →
``include_stop_str_in_output``, ``temperature`` below 1e-6 → greedy, ``json_schema`` (a JSON
string) and ``regex`` → the engine's constraint fields; the rest
keep their names. Accepted with no effect here: ``spaces_between_special_tokens`` (the fast
tokenizers' decode has no such switch), ``stream_interval`` (every token is streamed),
``custom_params`` (no custom logit processor is installed), ``beam_width`` ``1``. Answered 400
"not supported": ``stop_regex`` non-empty, ``logit_bias`` non-empty, ``beam_width`` > 1,
``ebnf``, ``structural_tag``, ``watermark``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentlang.runtime.sampling.fields import GREEDY_BELOW, is_int as _is_int, sglang_bound, to_engine
from agentlang.runtime.request.limits import RequestLimits
from agentlang.runtime.server.protocol import TOKEN_ID

DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128, "min_new_tokens": 0, "n": 1,
    "stop": None, "stop_token_ids": None, "stop_regex": None,
    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None,
    "ignore_eos": False, "skip_special_tokens": True, "spaces_between_special_tokens": True,
    "no_stop_trim": False, "stream_interval": None, "logit_bias": None, "sampling_seed": None,
    "custom_params": None, "beam_width": None, "watermark": None,
}
MAX_STOP_COUNT = 32
# The numeric fields, checked and documented by the bounds table (agentlang.runtime.sampling.fields).
_BOUNDED = ("max_new_tokens", "min_new_tokens", "n", "temperature", "top_p", "top_k", "min_p",
            "frequency_penalty", "presence_penalty", "repetition_penalty")
_BOOLS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
# The SGLang fields that reach the engine (renamed by SGLANG_NAMES); the rest are checked only.
_ENGINE_FIELDS = _BOUNDED + ("sampling_seed", "stop", "stop_token_ids", "ignore_eos",
                             "no_stop_trim", "skip_special_tokens", "json_schema", "regex")


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}      # null = the default


# What `if value:` lets through: the "not supported" fields accept exactly these.
_FALSY = {"enum": [None, False, 0, "", [], {}]}
_TEXT_OR_FALSY = {"anyOf": [{"type": "string"}, _FALSY]}
# The JSON schema of one ``sampling_params`` object, exactly as parse_sampling checks it (a
# token id's upper bound is the served vocabulary: see agentlang.runtime.server.openapi).
SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    **{name: _nullable(sglang_bound(name).json_schema()) for name in _BOUNDED},
    "stop": _nullable({"anyOf": [{"type": "string"}, {
        "type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP_COUNT}]}),
    "stop_token_ids": _nullable({"type": "array", "items": TOKEN_ID}),
    "stop_regex": _nullable({"type": "array", "maxItems": 0}),
    "json_schema": _TEXT_OR_FALSY, "regex": _TEXT_OR_FALSY, "ebnf": _FALSY,
    "structural_tag": _FALSY, "watermark": _FALSY, "logit_bias": _FALSY,
    **{name: _nullable({"type": "boolean"}) for name in _BOOLS},
    "stream_interval": _nullable({"type": "integer", "minimum": 1}),
    "sampling_seed": _nullable({"type": "integer", "minimum": -2**63, "maximum": 2**63 - 1}),
    "custom_params": _nullable({"type": "object"}),
    "beam_width": _nullable({"const": 1}),
}}


class NativeParamError(ValueError):
    """A bad ``sampling_params`` value; ``field`` is the request field it names."""

    def __init__(self, field: str, why: str):
        super().__init__(f"{field}: {why}")
        self.field = field


@dataclass(frozen=True)
class NativeSampling:
    """One prompt's parameters: engine fields, and whether it is a prefill-only request."""

    fields: dict[str, Any]      # SamplingParams keyword arguments (max_tokens None = up to limit)
    prefill_only: bool          # max_new_tokens == 0


def _str_list(v: Any, where: str) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return list(v)
    raise NativeParamError(where, f"must be a string or a list of strings, got {v!r}")


def parse_sampling(raw: Any, where: str, limits: RequestLimits) -> NativeSampling:
    """Checks ``raw`` (a dict or ``None``) as SGLang does and maps it to engine fields (stop
    token ids checked by the engine's ``limits``)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise NativeParamError(where, f"must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise NativeParamError(f"{where}.{unknown[0]}", f"unknown field `{unknown[0]}`; "
                               f"accepted: {', '.join(sorted(DEFAULTS))}")
    p = {k: (DEFAULTS[k] if raw.get(k) is None else raw[k]) for k in DEFAULTS}

    def bad(name: str, why: str) -> NativeParamError:
        return NativeParamError(f"{where}.{name}", f"{why}, got {p[name]!r}")

    max_new = raw.get("max_new_tokens", 128)          # null: up to the context limit
    for name in _BOUNDED:
        if name != "max_new_tokens" or max_new is not None:
            b = sglang_bound(name)
            if not b.accepts(p[name]):
                raise NativeParamError(f"{where}.{name}", b.why(p[name]))
    for name in _BOOLS:
        if not isinstance(p[name], bool):
            raise bad(name, "must be a boolean")
    if max_new is not None and p["min_new_tokens"] > max_new:
        raise bad("min_new_tokens", f"must be in [0, max_new_tokens({max_new})]")
    stop = _str_list(p["stop"], f"{where}.stop") if p["stop"] is not None else []
    if len(stop) > MAX_STOP_COUNT:
        raise bad("stop", f"at most {MAX_STOP_COUNT} stop strings")
    stop = [s for s in stop if s]
    ids = p["stop_token_ids"] or []
    if ids != []:
        name = f"{where}.stop_token_ids"
        try:
            ids = limits.check_ids(ids, name)
        except ValueError as e:     # its message starts with the field's name
            raise NativeParamError(name, str(e)[len(name) + 2:]) from None
    if p["stop_regex"] is not None and _str_list(p["stop_regex"], f"{where}.stop_regex"):
        raise bad("stop_regex", "not supported by this server (give stop strings instead)")
    if p["logit_bias"]:
        raise bad("logit_bias", "not supported by this server")
    if p["sampling_seed"] is not None and (not _is_int(p["sampling_seed"])
                                           or not -2**63 <= p["sampling_seed"] < 2**63):
        raise bad("sampling_seed", "must be an integer in [-2**63, 2**63 - 1]")
    if p["stream_interval"] is not None and (not _is_int(p["stream_interval"])
                                             or p["stream_interval"] < 1):
        raise bad("stream_interval", "must be an integer >= 1")
    if p["custom_params"] is not None and not isinstance(p["custom_params"], dict):
        raise bad("custom_params", "must be an object")
    if p["beam_width"] is not None and (not _is_int(p["beam_width"]) or p["beam_width"] != 1):
        raise bad("beam_width", "beam search is not supported by this server (only 1)")
    for name in ("ebnf", "structural_tag", "watermark"):
        if p[name]:
            raise bad(name, "not supported by this server")
    grammars = {k: p[k] or None for k in ("json_schema", "regex", "ebnf")}
    for name, v in grammars.items():
        if v is not None and not isinstance(v, str):
            raise bad(name, "must be a string")
    if sum(v is not None for v in grammars.values()) > 1:
        raise NativeParamError(where, "only one of json_schema, regex, ebnf, or "
                               "structural_tag can be set")
    if grammars["json_schema"] is not None:
        try:
            json.loads(grammars["json_schema"])
        except ValueError as e:
            raise bad("json_schema", f"must be a JSON string ({e})") from None
    p.update(max_new_tokens=max_new, stop=stop, stop_token_ids=list(ids),
             json_schema=grammars["json_schema"], regex=grammars["regex"])
    if p["temperature"] < GREEDY_BELOW:
        p["temperature"] = 0.0
    fields = {to_engine(k): p[k] for k in _ENGINE_FIELDS}
    return NativeSampling(fields, max_new == 0)


def engine_field_names(where: str) -> dict[str, str]:
    """Engine field → request field, for the engine's own ``ValueError`` messages."""
    return {to_engine(k): f"{where}.{k}" for k in DEFAULTS}
