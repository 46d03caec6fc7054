"""``@agentlang.tool``: a typed Python function becomes a tool with a JSON schema.

The schema comes from the type hints (every parameter needs one) and the docstring (the first
paragraph describes the tool; a Google-style ``Args:`` section or ``:param x:`` lines describe
parameters). Hints that cannot form a schema (``Any``, ``object``, arbitrary classes,
``*args``) raise ``ValueError`` at decoration time, naming the parameter.

Supported hints: str, int, float, bool, None, list[T], dict[str, T], tuple[...], Literal,
Enum subclasses, ``T | None`` / Optional[T], unions, Annotated[T, ...] and pydantic models.

Durations: a tool knows how long it takes (``@tool(expected_s=2.0)``, else the mean of its
runs so far, :class:`ToolTimes`). Before it runs, the agent loop tells the backend when the
program will generate again (``Backend.next_use``), so a server keeping the program's KV
releases the agents expected back last first.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_PRIMITIVES = {str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
               bool: {"type": "boolean"}, type(None): {"type": "null"}}


def hint_to_schema(hint: Any, where: str) -> dict:
    """JSON schema for a type hint; ``where`` names the parameter in error messages."""
    if hint in _PRIMITIVES:
        return dict(_PRIMITIVES[hint])
    if hint is None:
        return {"type": "null"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    if isinstance(hint, type) and hasattr(hint, "model_json_schema"):
        return hint.model_json_schema()
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        options = [hint_to_schema(a, where) for a in args]
        return {"anyOf": options}
    if origin in (list, typing.List) or hint is list:  # noqa: UP006
        if not args:
            raise ValueError(f"{where}: list needs an item type (list[int], list[str], ...)")
        return {"type": "array", "items": hint_to_schema(args[0], where)}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": hint_to_schema(args[0], where)}
        if args:
            return {"type": "array", "prefixItems": [hint_to_schema(a, where) for a in args],
                    "minItems": len(args), "maxItems": len(args)}
    if origin is dict:
        if not args or args[0] is not str:
            raise ValueError(f"{where}: dict needs str keys and a value type (dict[str, int])")
        return {"type": "object", "additionalProperties": hint_to_schema(args[1], where)}
    if typing.get_origin(hint) is typing.Annotated:
        return hint_to_schema(args[0], where)
    name = getattr(hint, "__name__", repr(hint))
    raise ValueError(f"{where}: type hint {name} cannot form a JSON schema; use str, int, "
                     f"float, bool, list[...], dict[str, ...], Literal[...], an Enum or a "
                     f"pydantic model")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google- or reST-style docstring."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    params: dict[str, str] = {}
    for m in re.finditer(r"^:param\s+(?:\w+\s+)?(\w+):\s*(.+)$", doc, re.M):
        params[m.group(1)] = m.group(2).strip()
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.+\n?)+)", doc, re.M)
    if section:
        current = None
        for line in section.group(1).splitlines():
            m = re.match(r"^\s+(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if m:
                current = m.group(1)
                params[current] = m.group(2).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
    description = re.split(r"\n\s*\n|^(?:Args|Arguments|Parameters|Returns|:param)", doc,
                           maxsplit=1, flags=re.M)[0]
    return " ".join(description.split()), params


TIMES_MEMORY = 0.5     # weight of the newest run in a tool's mean duration (exponential)


class ToolTimes:
    """How long one tool's runs took: an exponential mean, thread-safe (programs share tools)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mean: float | None = None

    def record(self, seconds: float) -> None:
        with self._lock:
            self._mean = seconds if self._mean is None else \
                TIMES_MEMORY * seconds + (1 - TIMES_MEMORY) * self._mean

    def mean(self) -> float | None:
        """Seconds, or None before the first run."""
        with self._lock:
            return self._mean


@dataclass(frozen=True, eq=False)
class Tool:
    """A callable tool. ``parameters`` is the JSON schema of its keyword arguments;
    ``expected_s`` its declared duration (None: learned from its runs, ``times``)."""

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict
    expected_s: float | None = None
    times: ToolTimes = field(default_factory=ToolTimes, repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def schema(self) -> dict:
        """OpenAI function-tool format."""
        return {"type": "function", "function": {"name": self.name,
                                                  "description": self.description,
                                                  "parameters": self.parameters}}

    def validate(self, arguments: Any) -> None:
        """Raise ValueError when ``arguments`` does not match the parameter schema."""
        import jsonschema

        try:
            jsonschema.validate(arguments, self.parameters)
        except jsonschema.ValidationError as e:
            raise ValueError(f"arguments for tool '{self.name}' do not match its schema: "
                             f"{e.message}") from None

    def expected_duration(self) -> float | None:
        """Seconds a run is expected to take: declared, else the mean so far (None: unknown)."""
        return self.expected_s if self.expected_s is not None else self.times.mean()

    def invoke(self, arguments: dict) -> Any:
        """Validate ``arguments`` and call the function with them (its duration recorded)."""
        self.validate(arguments)
        t0 = time.monotonic()
        try:
            return self.fn(**arguments)
        finally:
            self.times.record(time.monotonic() - t0)


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         description: str | None = None, expected_s: float | None = None) -> Any:
    """Decorator: ``@tool`` or ``@tool(name=..., description=..., expected_s=...)``;
    ``expected_s``: seconds a run takes (a next-use hint; default: learned from its runs)."""
    if fn is None:
        return lambda f: tool(f, name=name, description=description, expected_s=expected_s)
    if isinstance(fn, Tool):
        return fn
    if not callable(fn):
        raise ValueError(f"@tool needs a function, got {type(fn).__name__}")
    if expected_s is not None:
        from agentlang.runtime.sampling.fields import bound

        bound("next_use_s").check("expected_s", expected_s)
    doc_description, doc_params = parse_docstring(fn.__doc__)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as e:  # noqa: BLE001 - unresolvable annotations
        raise ValueError(f"tool {fn.__name__}: cannot resolve type hints: {e}") from None
    properties: dict[str, dict] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        where = f"tool {fn.__name__}, parameter '{param.name}'"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"{where}: *args/**kwargs cannot form a JSON schema; list the "
                             f"parameters explicitly")
        if param.name not in hints:
            raise ValueError(f"{where} has no type hint; every tool parameter needs one")
        schema = hint_to_schema(hints[param.name], where)
        if param.name in doc_params:
            schema["description"] = doc_params[param.name]
        if param.default is param.empty:
            required.append(param.name)
        elif param.default is None or isinstance(param.default, (str, int, float, bool)):
            schema["default"] = param.default
        properties[param.name] = schema
    parameters = {"type": "object", "properties": properties, "required": required,
                  "additionalProperties": False}
    return Tool(fn=fn, name=name or fn.__name__,
                description=description or doc_description or fn.__name__,
                parameters=parameters, expected_s=expected_s)
