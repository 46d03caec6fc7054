"""Sampling options of one generation, as the frontend passes them to a backend.

Field names follow ``runtime.SamplingParams`` so the in-process backend maps them 1:1.
In a ``gen`` node every field may be ``None`` (= "not set here"); the interpreter merges a
gen's options over the run's defaults (``SamplingOptions.merged_over``) before calling a
backend, so backends always see a fully resolved object.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

SGLANG_LOGPROB_FIELDS = ("return_logprob", "top_logprobs_num")   # SGLang's names: -> logprobs
CONSTRAINTS = ("json_schema", "regex", "grammar", "value_type", "tool_calls")   # at most one
VALUE_TYPES = {int: "int", float: "float", bool: "bool", str: "str",
               "int": "int", "float": "float", "bool": "bool", "str": "str"}


@dataclass(frozen=True)
class SamplingOptions:
    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    seed: int | None = None
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None
    json_schema: Any = None      # dict | JSON str | pydantic model class
    regex: str | None = None
    grammar: str | None = None   # Lark grammar
    value_type: str | None = None  # "int" | "float" | "bool" | "str"
    tool_calls: Any = None       # {"tools", "format", "forced"}: calls in a family's format
    priority: int | None = None  # scheduling priority, higher first (None: the backend's default)
    agent: str | None = None     # accounting label (a run's default: the program name)

    @property
    def logprobs(self) -> int | None:
        """Runtime ``logprobs``: None (none), 0 (chosen token only) or k top alternatives."""
        if not self.return_logprob and not self.top_logprobs_num:
            return None
        return self.top_logprobs_num or 0

    @property
    def constraint(self) -> str | None:
        """Which structured-output constraint is set, if any."""
        for name in CONSTRAINTS:
            if getattr(self, name) is not None:
                return name
        return None

    def merged_over(self, defaults: SamplingOptions) -> SamplingOptions:
        """Fields set here override ``defaults``; a constraint set here drops the default's."""
        base = defaults
        if self.constraint is not None:
            base = replace(defaults, **dict.fromkeys(CONSTRAINTS))
        updates = {f.name: getattr(self, f.name) for f in fields(self)
                   if getattr(self, f.name) is not None}
        return replace(base, **updates)

    def with_extra_stop(self, extra: tuple[str, ...]) -> SamplingOptions:
        if not extra:
            return self
        stop = tuple(self.stop or ())
        return replace(self, stop=stop + tuple(s for s in extra if s not in stop))

    def engine_fields(self) -> dict[str, Any]:
        """The fields set here under the engine's names (``SamplingParams`` keywords): the
        option names are the engine's but for the logprob pair, which becomes ``logprobs``;
        sequences become lists. Backends rename from these (SGLang's names: the runtime's
        table, :data:`agentlang.runtime.sampling.fields.SGLANG_NAMES`)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in SGLANG_LOGPROB_FIELDS and getattr(self, f.name) is not None}
        for name in ("stop", "stop_token_ids"):
            if name in out:
                out[name] = list(out[name])
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        return out

    def json_schema_dict(self) -> dict | None:
        """The JSON schema as a dict (pydantic classes and JSON strings converted)."""
        return schema_to_dict(self.json_schema)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def schema_to_dict(schema: Any) -> dict | None:
    if schema is None:
        return None
    if isinstance(schema, dict):
        return schema
    if isinstance(schema, str):
        import json
        return json.loads(schema)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    raise ValueError(f"json_schema must be a dict, a JSON string or a pydantic model class, "
                     f"got {type(schema).__name__}")


def make_options(*, max_tokens=None, min_tokens=None, stop=None, stop_token_ids=None,
                 temperature=None, top_p=None, top_k=None, min_p=None, frequency_penalty=None,
                 presence_penalty=None, repetition_penalty=None, ignore_eos=None, seed=None,
                 return_logprob=None, top_logprobs_num=None, dtype=None, regex=None,
                 json_schema=None, grammar=None, priority=None, agent=None) -> SamplingOptions:
    """Validate user-facing gen()/run() arguments; raises ValueError naming the field (the
    numeric ranges are the runtime's one table, :mod:`agentlang.runtime.sampling.fields`)."""
    from agentlang.runtime.sampling.fields import bound

    for name, value in (("max_tokens", max_tokens), ("min_tokens", min_tokens),
                        ("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
                        ("min_p", min_p), ("frequency_penalty", frequency_penalty),
                        ("presence_penalty", presence_penalty),
                        ("repetition_penalty", repetition_penalty)):
        if value is not None:
            bound(name).check(name, value)
    if top_logprobs_num is not None:
        bound("logprobs").check("top_logprobs_num", top_logprobs_num)
    if isinstance(stop, str):
        stop = (stop,)
    elif stop is not None:
        stop = tuple(stop)
        if not all(isinstance(x, str) and x for x in stop):
            raise ValueError(f"stop must be a non-empty str or a list of them, got {stop!r}")
    if priority is not None or agent is not None:
        check_scheduling(priority, agent)
    if stop_token_ids is not None:
        stop_token_ids = tuple(int(t) for t in stop_token_ids)
    value_type = None
    if dtype is not None:
        if dtype not in VALUE_TYPES:
            raise ValueError(f"dtype must be one of int, float, bool, str, got {dtype!r}")
        value_type = VALUE_TYPES[dtype]
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"regex {regex!r} does not compile: {e}") from None
    if grammar is not None and not isinstance(grammar, str):
        raise ValueError("grammar must be a Lark grammar string")
    if json_schema is not None:
        schema_to_dict(json_schema)  # validates the type early
    set_constraints = [n for n, v in (("dtype", value_type), ("regex", regex),
                                      ("json_schema", json_schema), ("grammar", grammar))
                       if v is not None]
    if len(set_constraints) > 1:
        raise ValueError(f"at most one of dtype, regex, json_schema, grammar may be set; "
                         f"got {', '.join(set_constraints)}")
    return SamplingOptions(
        max_tokens=max_tokens, min_tokens=min_tokens, stop=stop, stop_token_ids=stop_token_ids,
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty, ignore_eos=ignore_eos, seed=seed,
        return_logprob=return_logprob, top_logprobs_num=top_logprobs_num,
        json_schema=json_schema, regex=regex, grammar=grammar, value_type=value_type,
        priority=priority, agent=agent)


def check_scheduling(priority: Any, agent: Any) -> None:
    """ValueError naming ``priority`` / ``agent`` unless both are None or valid (the runtime
    owns the accepted range and label format)."""
    from agentlang.runtime.core.agent_stats import check_label
    from agentlang.runtime.core.priority import check_priority

    if priority is not None:
        check_priority(priority, "priority")
    check_label(agent, "agent")


def run_defaults(*, max_new_tokens=128, stop=None, stop_token_ids=None, temperature=1.0,
                 top_p=1.0, top_k=-1, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0,
                 repetition_penalty=1.0, ignore_eos=False, seed=None, return_logprob=False,
                 top_logprobs_num=None, priority=None, agent=None) -> SamplingOptions:
    """The base options of a run (SGLang's ``run()`` defaults)."""
    opts = make_options(max_tokens=max_new_tokens, stop=stop, stop_token_ids=stop_token_ids,
                        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                        repetition_penalty=repetition_penalty, ignore_eos=ignore_eos, seed=seed,
                        return_logprob=return_logprob, top_logprobs_num=top_logprobs_num,
                        priority=priority, agent=agent)
    return replace(opts, min_tokens=0, stop=opts.stop or (), stop_token_ids=opts.stop_token_ids or ())


RUN_OPTION_NAMES = ("max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k",
                    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
                    "ignore_eos", "seed", "return_logprob", "top_logprobs_num", "priority",
                    "agent")
