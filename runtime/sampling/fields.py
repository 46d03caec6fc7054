"""The one table of sampling-parameter bounds, and the one table of SGLang's names.

Every surface derives its checks from :data:`BOUNDS`: the engine's
:class:`~agentlang.runtime.sampling.params.SamplingParams` (``ValueError``), the OpenAI request
models (pydantic ``ge``/``gt``/``le`` → a 400 and ``/openapi.json``), SGLang's
``sampling_params`` (its JSON schema and its 400s) and the DSL's ``gen()`` / ``run()`` options
(``ValueError``). Change a bound here and all of them follow (``tests/sampling/test_fields.py``
does). :data:`GREEDY_BELOW` is the one greedy threshold.

:data:`SGLANG_NAMES` renames SGLang's ``sampling_params`` fields to the engine's (requests)
and back (error fields, the DSL's ``RuntimeEndpoint``); :data:`SGLANG_BOUNDS` holds the two
places where SGLang's own checks are stricter than the engine's (its ``verify``).

Pure Python, no torch: the frontend and the server import it without loading the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

GREEDY_BELOW = 1e-6   # a temperature this small is greedy (as SGLang's): 1/T would overflow


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A finite int or float (``bool`` is not a number here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class Bound:
    """The accepted values of one numeric field: ``integer`` or ``number`` in the range
    ``low``..``high`` (``None`` = unbounded; ``*_open`` = the end itself excluded), or equal to
    one of ``off`` (sentinels outside the range, e.g. ``top_k`` ``-1``)."""

    integer: bool
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    off: tuple[int, ...] = ()

    def accepts(self, v: Any) -> bool:
        if not (is_int(v) if self.integer else is_number(v)):
            return False
        if v in self.off:
            return True
        if self.low is not None and (v <= self.low if self.low_open else v < self.low):
            return False
        return self.high is None or (v < self.high if self.high_open else v <= self.high)

    def text(self) -> str:
        """What an error message says is accepted, e.g. ``in (0, 1]``, ``an integer >= 1``."""
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            rng = (f"{'(' if self.low_open else '['}{_num_text(self.low)}, "
                   f"{_num_text(self.high)}{')' if self.high_open else ']'}")
            why = f"in {rng}" if not self.integer else f"an integer in {rng}"
        elif self.low is not None:
            why = f"{kind} {'>' if self.low_open else '>='} {_num_text(self.low)}"
        elif self.high is not None:
            why = f"{kind} {'<' if self.high_open else '<='} {_num_text(self.high)}"
        else:
            why = kind
        if not self.off:
            return why
        return f"{' or '.join(str(o) for o in self.off)} (off), or {why}"

    def why(self, v: Any) -> str:
        return f"must be {self.text()}, got {v!r}"

    def message(self, name: str, v: Any) -> str:
        return f"{name}: {self.why(v)}"

    def check(self, name: str, v: Any) -> None:
        """``ValueError`` naming ``name`` unless ``v`` is accepted."""
        if not self.accepts(v):
            raise ValueError(self.message(name, v))

    def json_schema(self) -> dict[str, Any]:
        """This bound as JSON Schema (draft 2020-12 keywords, as OpenAPI 3.1 uses)."""
        s: dict[str, Any] = {"type": "integer" if self.integer else "number"}
        if self.low is not None:
            s["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        if self.high is not None:
            s["exclusiveMaximum" if self.high_open else "maximum"] = self.high
        return {"anyOf": [*({"const": o} for o in self.off), s]} if self.off else s

    def pydantic(self) -> dict[str, float]:
        """``pydantic.Field`` keywords for this range (``off``: see :func:`pydantic_bounds`)."""
        out = {}
        if self.off and self.low is not None and min(self.off) < self.low:
            out["ge"] = min(self.off)        # top_k: -1 and 0 are the values below the range
        elif self.low is not None:
            out["gt" if self.low_open else "ge"] = self.low
        if self.high is not None:
            out["lt" if self.high_open else "le"] = self.high
        return out


BOUNDS: MappingProxyType[str, Bound] = MappingProxyType({
    "max_tokens": Bound(True, low=1),
    "min_tokens": Bound(True, low=0),               # and <= max_tokens
    "temperature": Bound(False, low=0),             # below GREEDY_BELOW: greedy
    "top_p": Bound(False, low=0, high=1, low_open=True),
    "top_k": Bound(True, low=1, off=(-1, 0)),       # the engine stores 0 as -1
    "min_p": Bound(False, low=0, high=1),
    "repetition_penalty": Bound(False, low=0, low_open=True),
    "frequency_penalty": Bound(False, low=-2, high=2),
    "presence_penalty": Bound(False, low=-2, high=2),
    "logprobs": Bound(True, low=0, high=20),
    "prompt_logprobs": Bound(True, low=0, high=20),
    "n": Bound(True, low=1, high=64),
    "json_indent": Bound(True, low=0),
    "next_use_s": Bound(False, low=0, high=86400),  # seconds; a day at most
})
# None: off / compact JSON / no next-use hint
NONE_IS_OFF = ("logprobs", "prompt_logprobs", "json_indent", "next_use_s")

# SGLang's ``sampling_params`` name -> the engine's field; names not listed are the same in both.
SGLANG_NAMES: MappingProxyType[str, str] = MappingProxyType({
    "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
    "sampling_seed": "seed", "no_stop_trim": "include_stop_str_in_output",
})
ENGINE_TO_SGLANG: MappingProxyType[str, str] = MappingProxyType(
    {v: k for k, v in SGLANG_NAMES.items()})

# Where SGLang's own ``verify`` is stricter (or, for ``max_new_tokens``, looser: 0 = prefill
# only) than the engine's bound, by SGLang name; every other field uses BOUNDS.
SGLANG_BOUNDS: MappingProxyType[str, Bound] = MappingProxyType({
    "max_new_tokens": Bound(True, low=0),
    "top_k": Bound(True, low=1, off=(-1,)),
    "repetition_penalty": Bound(False, low=0, high=2, low_open=True),
})


def bound(name: str) -> Bound:
    """The engine's bound of field ``name`` (``KeyError`` for a field without one)."""
    return BOUNDS[name]


def sglang_bound(sglang_name: str) -> Bound:
    """The bound SGLang's protocol applies to its field ``sglang_name``."""
    return SGLANG_BOUNDS.get(sglang_name) or BOUNDS[to_engine(sglang_name)]


def to_engine(sglang_name: str) -> str:
    return SGLANG_NAMES.get(sglang_name, sglang_name)


def to_sglang(engine_name: str) -> str:
    return ENGINE_TO_SGLANG.get(engine_name, engine_name)


def pydantic_bounds(name: str) -> dict[str, float]:
    """``pydantic.Field`` keywords of the engine field ``name`` for a request model."""
    return BOUNDS[name].pydantic()
