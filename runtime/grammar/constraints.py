"""Normalize and validate the structured-output fields of a request into one :class:`Constraint`.

A request may set at most one of ``json_schema``, ``regex``, ``choices``, ``grammar`` and
``value_type``; :func:`constraint_from_params` checks it, validates it (JSON schema against its
metaschema, regex compiles, Lark grammar parses with the ``lark`` package) and returns a frozen,
hashable :class:`Constraint` whose ``spec`` is canonical text, so equal constraints share one
compiled grammar in the cache. Every user mistake raises ``ValueError`` naming the field,
including constraints no output satisfies (:mod:`agentlang.runtime.grammar.satisfiable`).
Backend-specific limits (an unsupported JSON-schema keyword, a regex feature a backend lacks) are
reported by the backend when it compiles, also as ``ValueError``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agentlang.runtime.grammar.satisfiable import (check_lark_productive, check_regex_matches_something,
                                         check_schema_consistent)
from agentlang.runtime.core.typed_values import (REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR,  # noqa: F401
                                  VALUE_TYPE_REGEX)

CONSTRAINT_FIELDS = ("json_schema", "regex", "choices", "grammar", "value_type", "tool_calls")
KINDS = ("json_schema", "regex", "choices", "grammar", "type", "tool_calls")
TOOL_CALL_TRIGGER = "<tool_call>"


@dataclass(frozen=True)
class Constraint:
    """One normalized output constraint.

    ``kind`` is one of :data:`KINDS`. ``spec`` is canonical text per kind: ``json_schema`` →
    the schema as compact JSON (key order kept: it is the order properties are generated in);
    ``regex`` → the pattern; ``choices`` → a JSON list of the strings; ``grammar`` → the Lark
    source; ``type`` → the value type name (``int``/``float``/``bool``/``str``);
    ``tool_calls`` → a JSON list of ``{"name", "parameters"}``: free text in which every
    ``<tool_call>`` starts a call ``{"name": "<name>", "arguments": <parameters instance>}``
    closed by ``</tool_call>`` (``tool_choice="auto"``: a started call is always valid).
    In another family's call format (:mod:`~agentlang.runtime.grammar.tool_format`), or with
    ``forced`` (``tool_choice`` required / named: one call and nothing else), the spec is
    ``{"format", "forced", "tools"}``.
    ``json_indent`` is only set for ``json_schema``: ``None`` means compact JSON (no whitespace
    at all), an int means pretty-printed with that indent. ``reasoning`` (a key of
    :data:`~agentlang.runtime.grammar.tool_format.REASONING`): the output opens with that
    reasoning block, free text, and the constraint applies after it (json_schema, tool_calls).
    """

    kind: str
    spec: str
    json_indent: int | None = None
    reasoning: str | None = None

    def schema(self) -> dict[str, Any]:
        assert self.kind == "json_schema", self.kind
        return json.loads(self.spec)

    def choice_list(self) -> list[str]:
        assert self.kind == "choices", self.kind
        return json.loads(self.spec)

    def tools(self) -> list[dict]:
        assert self.kind == "tool_calls", self.kind
        spec = json.loads(self.spec)
        return spec["tools"] if isinstance(spec, dict) else spec

    def call_format(self) -> tuple[str, bool]:
        """``(format name, forced)`` of a tool_calls constraint."""
        assert self.kind == "tool_calls", self.kind
        spec = json.loads(self.spec)
        return (spec["format"], spec["forced"]) if isinstance(spec, dict) else ("agentlang", False)

    def type_regex(self) -> str:
        assert self.kind == "type", self.kind
        return VALUE_TYPE_REGEX[self.spec]


def constraint_from_params(
    json_schema: dict | str | type | None = None,
    regex: str | None = None,
    choices: list[str] | None = None,
    grammar: str | None = None,
    value_type: str | None = None,
    json_indent: int | None = None,
    tool_calls: list[dict] | dict | None = None,
    reasoning: str | None = None,
) -> Constraint | None:
    """Validate the structured-output fields of a request; ``None`` when none is set.

    ``json_schema`` may be a dict, a JSON string or a pydantic ``BaseModel`` subclass (its
    ``model_json_schema()`` is used). Raises ``ValueError`` naming the field and the reason.
    """
    given = [
        name
        for name, value in zip(CONSTRAINT_FIELDS,
                               (json_schema, regex, choices, grammar, value_type, tool_calls))
        if value is not None
    ]
    if len(given) > 1:
        raise ValueError(
            f"only one of {', '.join(CONSTRAINT_FIELDS)} may be set, got {', '.join(given)}"
        )
    if json_indent is not None:
        if json_schema is None:
            raise ValueError("json_indent: only applies together with json_schema")
        if isinstance(json_indent, bool) or not isinstance(json_indent, int) or json_indent < 0:
            raise ValueError(f"json_indent: must be a non-negative int or None, got {json_indent!r}")
    if not given:
        if reasoning is not None:
            raise ValueError("reasoning: only applies together with json_schema or tool_calls")
        return None
    if reasoning is not None:
        from agentlang.runtime.grammar.tool_format import REASONING

        if reasoning not in REASONING:
            raise ValueError(f"reasoning: unknown block {reasoning!r}; accepted: {', '.join(REASONING)}")
        if json_schema is None and tool_calls is None:
            raise ValueError(f"reasoning: only applies together with json_schema or tool_calls, "
                             f"not {given[0]}")
    if json_schema is not None:
        return Constraint("json_schema", _normalize_schema(json_schema), json_indent, reasoning)
    if regex is not None:
        return Constraint("regex", _validate_regex(regex))
    if choices is not None:
        return Constraint("choices", _normalize_choices(choices))
    if grammar is not None:
        return Constraint("grammar", _validate_lark(grammar))
    if tool_calls is not None:
        return Constraint("tool_calls", _normalize_tool_calls(tool_calls), reasoning=reasoning)
    if value_type not in VALUE_TYPE_REGEX:
        raise ValueError(
            f"value_type: unknown type {value_type!r}; accepted: {', '.join(VALUE_TYPE_REGEX)}"
        )
    return Constraint("type", value_type)


def _normalize_schema(schema: dict | str | type, field: str = "json_schema") -> str:
    if isinstance(schema, type):
        dump = getattr(schema, "model_json_schema", None)
        if dump is None:
            raise ValueError(
                f"{field}: a class must be a pydantic BaseModel subclass, got {schema.__name__}"
            )
        schema = dump()
    elif isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{field}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
            ) from None
    if not isinstance(schema, dict):
        raise ValueError(
            f"{field}: must be a JSON object (dict), got {type(schema).__name__}"
        )
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise ValueError(f"{field}: invalid JSON schema at {where}: {e.message}") from None
    check_schema_consistent(schema, field)
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{field}: not serializable as JSON: {e}") from None


def _normalize_tool_calls(value: list[dict] | dict) -> str:
    """The list form (agentlang's format, free text), or ``{"tools", "format", "forced"}``."""
    from agentlang.runtime.grammar.tool_format import FORMATS

    if not isinstance(value, dict):
        return _normalize_tools(value)
    fmt, forced = value.get("format", "agentlang"), value.get("forced", False)
    if fmt not in FORMATS:
        raise ValueError(f"tool_calls.format: unknown format {fmt!r}; accepted: {', '.join(FORMATS)}")
    if not isinstance(forced, bool):
        raise ValueError(f"tool_calls.forced: must be true or false, got {forced!r}")
    extra = set(value) - {"tools", "format", "forced"}
    if extra:
        raise ValueError(f"tool_calls: unknown keys {sorted(extra)}; accepted: tools, format, forced")
    tools = json.loads(_normalize_tools(value.get("tools")))
    if fmt == "agentlang" and not forced:
        return json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
    return json.dumps({"format": fmt, "forced": forced, "tools": tools},
                      separators=(",", ":"), ensure_ascii=False)


def _normalize_tools(tools: list[dict]) -> str:
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ValueError("tool_calls: must be a non-empty list of {name, parameters}")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise ValueError(f"tool_calls: item {i} needs a non-empty string name")
        if any(t["name"] == o["name"] for o in out):
            raise ValueError(f"tool_calls: item {i}: duplicate tool name {t['name']!r}")
        params = json.loads(_normalize_schema(t.get("parameters", {"type": "object"}),
                                              "tool_calls"))
        out.append({"name": t["name"], "parameters": params})
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def _validate_regex(regex: str) -> str:
    if not isinstance(regex, str):
        raise ValueError(f"regex: must be a string, got {type(regex).__name__}")
    if regex == "":
        raise ValueError("regex: must not be empty")
    try:
        re.compile(regex)
    except re.error as e:
        raise ValueError(f"regex: invalid regular expression at position {e.pos}: {e.msg}") from None
    check_regex_matches_something(regex)
    return regex


def _normalize_choices(choices: list[str]) -> str:
    if isinstance(choices, (str, bytes)) or not isinstance(choices, (list, tuple)):
        raise ValueError(f"choices: must be a list of strings, got {type(choices).__name__}")
    if not choices:
        raise ValueError("choices: must not be empty")
    for i, c in enumerate(choices):
        if not isinstance(c, str):
            raise ValueError(f"choices: item {i} is {type(c).__name__}, not a string")
    return json.dumps(list(choices), ensure_ascii=False)


def _validate_lark(grammar: str) -> str:
    if not isinstance(grammar, str):
        raise ValueError(f"grammar: must be a Lark grammar string, got {type(grammar).__name__}")
    from agentlang.runtime.grammar.lark_ebnf import load_lark

    parser = load_lark(grammar)  # raises ValueError("grammar: ... at line L, column C ...")
    check_lark_productive(parser)
    return grammar
