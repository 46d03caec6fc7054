"""Per-request sampling parameters, validated at construction.

Every invalid value raises ``ValueError`` naming the field and the accepted range (the ranges
and the greedy threshold are :mod:`agentlang.runtime.sampling.fields`' table); unknown fields
raise ``ValueError`` listing the accepted ones (``SamplingParams(bogus=1)`` included).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from agentlang.runtime.core.agent_stats import check_label
from agentlang.runtime.grammar.constraints import CONSTRAINT_FIELDS, Constraint, constraint_from_params
from agentlang.runtime.core.priority import check_priority
from agentlang.runtime.sampling.fields import BOUNDS, GREEDY_BELOW, NONE_IS_OFF, is_int




@dataclass(init=False)
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0          # 0 (or below GREEDY_BELOW) = greedy
    top_p: float = 1.0
    top_k: int = -1                   # -1 or 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None       # None = off; k = chosen token + top-k alternatives
    prompt_logprobs: int | None = None
    n: int = 1
    skip_special_tokens: bool = True
    # Structured output (agentlang.runtime.grammar): at most one of these.
    json_schema: Any = None           # dict | JSON string | pydantic model class
    regex: str | None = None
    choices: list[str] | None = None
    grammar: str | None = None        # Lark grammar
    value_type: str | None = None     # "int" | "float" | "bool" | "str"
    tool_calls: list[dict] | dict | None = None  # [{"name", "parameters"}] (or {tools, format,
                                      # forced}: grammar.tool_format): text with valid calls
    json_indent: int | None = None    # None = compact JSON
    reasoning: str | None = None      # "think": the constraint applies after a <think> block
    jump_forward: bool = True
    speculative: bool | None = None   # drafts from the context (agentlang.runtime.speculative);
                                      # None: the engine's setting
    # Constrained output: keep a valid completion within max_tokens (agentlang.runtime.grammar.budget);
    # a budget below the shortest valid output is refused at submit.
    complete_within_budget: bool = True
    cache_salt: str | None = None     # tenant isolation in the prefix cache
    priority: int = 0                 # higher first (agentlang.runtime.core.priority: range, aging)
    agent: str | None = None          # accounting label (agentlang.runtime.core.agent_stats)
    session: str | None = None        # the session (agentlang.runtime.engine.sessions): its KV is
                                      # kept for the next turn; opened on first use
    next_use_s: float | None = None   # hint: seconds until this request's continuation (its
                                      # session's, or its tool call's) arrives (engine.sessions)

    def __init__(self, **kwargs: Any):
        names = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise ValueError(
                f"unknown sampling field(s) {unknown}; accepted: {', '.join(sorted(names))}"
            )
        for name, f in names.items():
            if name in kwargs:
                value = kwargs[name]
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            setattr(self, name, value)
        self._normalize()
        self.validate()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SamplingParams":
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> "SamplingParams":
        return SamplingParams(**{**self.to_dict(), **changes})

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW or self.top_k == 1

    @property
    def has_constraint(self) -> bool:
        return self.constraint_field() is not None

    @functools.cached_property
    def constraint(self) -> Constraint | None:
        """The output constraint, normalised and validated once (on first use: at submit);
        ``None`` when none is set. ``ValueError`` naming the field for a bad or unsatisfiable
        constraint (not remembered: raised again on the next use). Set the constraint fields
        before first use: later changes are not seen."""
        return constraint_from_params(json_indent=self.json_indent, reasoning=self.reasoning,
                                      **{k: getattr(self, k) for k in CONSTRAINT_FIELDS})

    def constraint_field(self) -> str | None:
        """The name of the output-constraint field that is set, if any."""
        return next((k for k in CONSTRAINT_FIELDS if getattr(self, k) is not None), None)

    def _normalize(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if self.top_k == 0:
            self.top_k = -1

    def validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name}: {why}, got {getattr(self, name)!r}")

        for name, b in BOUNDS.items():
            v = getattr(self, name)
            if v is not None or name not in NONE_IS_OFF:
                b.check(name, v)
        if self.min_tokens > self.max_tokens:
            raise bad("min_tokens", "must be in [0, max_tokens]")
        if self.seed is not None and not is_int(self.seed):
            raise bad("seed", "must be an integer or None")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "must be a non-empty string or a list of non-empty strings")
        if not isinstance(self.stop_token_ids, list) or not all(
            is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise bad("stop_token_ids", "must be a list of token ids >= 0")
        if self.cache_salt is not None and not isinstance(self.cache_salt, str):
            raise bad("cache_salt", "must be a string")
        check_priority(self.priority, "priority")
        check_label(self.agent, "agent")
        if self.session is not None and not (isinstance(self.session, str) and
                                             0 < len(self.session) <= 256):
            raise bad("session", "must be a non-empty string of at most 256 characters")
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens",
                     "jump_forward", "complete_within_budget"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be a boolean")
        if self.speculative is not None and not isinstance(self.speculative, bool):
            raise bad("speculative", "must be true, false or null (the server's setting)")
