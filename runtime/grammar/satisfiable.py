"""Constraints no output can satisfy, refused when the constraint is normalised (before any
backend compiles it, so both backends refuse them alike and at submit).

* **Regexes with no match** (:func:`check_regex_matches_something`): a character class with no
  character (``[^\\s\\S]``, ``[^\\x00-\\U0010ffff]``) in a part every match must go through.
  The pattern is read with Python's own parser. Constructs whose emptiness is not decided here
  (anchors, lookaround) count as possibly matching; a dead end such a pattern reaches while
  decoding fails that request alone (:mod:`agentlang.runtime.engine.constrained_step`).
* **JSON schemas with contradictory keywords** (:func:`check_schema_consistent`): in any
  subschema (outside ``not`` and ``if``), ``minItems`` > ``maxItems``, ``minLength`` >
  ``maxLength``, ``minProperties`` > ``maxProperties``, ``minContains`` > ``maxContains``, an
  empty numeric range (``minimum`` / ``exclusiveMinimum`` against ``maximum`` /
  ``exclusiveMaximum``), or an ``enum`` / ``const`` none of whose values satisfies the rest of
  its subschema (``"enum": ["abc"]`` with ``"pattern": "^[0-9]+$"``; checked with
  ``jsonschema`` itself, skipped where the rest uses ``$ref``). Such a subschema is a mistake
  even where a sibling ``anyOf`` branch could match, and is refused wherever it sits.

* **Lark grammars with a rule that derives no finite text** (:func:`check_lark_productive`):
  every alternative recurses forever (``x: "c" x``) or needs a terminal that matches nothing.
  Such a rule is refused even where an alternative avoids it (its forced text would never end:
  xgrammar runs out of memory computing it).

All raise :class:`UnsatisfiableConstraint`, a ``ValueError`` whose message starts with the
constraint's field.
"""

from __future__ import annotations

import json
from typing import Any

try:
    from re import _parser as sre  # Python >= 3.11
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as sre  # type: ignore[no-redef]

_MAX_CODEPOINT = 0x10FFFF
_NEGATION = {sre.CATEGORY_DIGIT: sre.CATEGORY_NOT_DIGIT, sre.CATEGORY_WORD: sre.CATEGORY_NOT_WORD,
             sre.CATEGORY_SPACE: sre.CATEGORY_NOT_SPACE}
_REPEATS = tuple(op for op in (sre.MAX_REPEAT, sre.MIN_REPEAT,
                               getattr(sre, "POSSESSIVE_REPEAT", None)) if op is not None)
_BOUNDS = (("minItems", "maxItems"), ("minLength", "maxLength"),
           ("minProperties", "maxProperties"), ("minContains", "maxContains"))
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMAS = ("additionalProperties", "items", "contains", "propertyNames",
               "unevaluatedItems", "unevaluatedProperties", "additionalItems", "then", "else")


class UnsatisfiableConstraint(ValueError):
    """No output satisfies the constraint (e.g. ``minItems`` > ``maxItems``); the message
    starts with the constraint's field."""


# ---- regexes ----------------------------------------------------------------------------------
def check_regex_matches_something(pattern: str, field: str = "regex") -> None:
    """``UnsatisfiableConstraint`` when ``pattern`` (valid for ``re``) provably matches no
    string."""
    parsed = sre.parse(pattern)
    if _seq_empty(parsed):
        raise UnsatisfiableConstraint(
            f"{field}: /{pattern}/ matches no string (a character class with no character "
            "in a part every match needs)")


def _seq_empty(items) -> bool:
    return any(_item_empty(op, av) for op, av in items)


def _item_empty(op, av) -> bool:
    if op is sre.IN:
        return _class_empty(av)
    if op is sre.BRANCH:
        return all(_seq_empty(alt) for alt in av[1])
    if op is sre.SUBPATTERN:
        return _seq_empty(av[3])
    if op in _REPEATS:
        lo, _hi, sub = av
        return lo > 0 and _seq_empty(sub)
    return False   # literals, '.', and constructs not decided here (anchors, lookaround)


def _class_empty(items) -> bool:
    """A ``[...]`` that contains no character: nothing listed, or negated and covering every
    code point (a class escape and its negation, or ranges up to U+10FFFF)."""
    negate = any(op is sre.NEGATE for op, _ in items)
    cats = {av for op, av in items if op is sre.CATEGORY}
    ranges = sorted([(av, av) for op, av in items if op is sre.LITERAL] +
                    [av for op, av in items if op is sre.RANGE])
    if not negate:
        return not ranges and not cats
    if any(neg in cats for cat, neg in _NEGATION.items() if cat in cats):
        return True
    covered = 0                               # first code point not yet covered
    for lo, hi in ranges:
        if lo > covered:
            return False
        covered = max(covered, hi + 1)
    return covered > _MAX_CODEPOINT


# ---- Lark grammars -----------------------------------------------------------------------------
def check_lark_productive(parser, field: str = "grammar") -> None:
    """``UnsatisfiableConstraint`` naming the first rule (in grammar order) of a loaded ``Lark``
    ``parser`` that derives no finite text (the classic productive-symbol fixpoint)."""
    terminals = {t.name: t for t in parser.terminals}
    productive = {name for name, t in terminals.items()
                  if t.pattern.type == "str" or not _seq_empty(sre.parse(t.pattern.to_regexp()))}
    rules = [(r.origin.name, r.expansion) for r in parser.rules]
    changed = True
    while changed:
        changed = False
        for name, expansion in rules:
            if name not in productive and all(sym.name in productive for sym in expansion):
                productive.add(name)
                changed = True
    for name, _ in rules:
        if name not in productive:
            raise UnsatisfiableConstraint(
                f"{field}: rule {name} derives no finite text (each alternative recurses "
                "forever or needs a terminal that matches nothing)")


# ---- JSON schemas -----------------------------------------------------------------------------
def check_schema_consistent(schema: dict[str, Any], field: str = "json_schema") -> None:
    """``UnsatisfiableConstraint`` naming ``field`` and the subschema's JSON pointer when some
    subschema's keywords contradict each other (see the module doc)."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)
    for path, node in _subschemas(schema, ""):
        why = _contradiction(node, validator)
        if why is not None:
            raise UnsatisfiableConstraint(
                f"{field}: {why} at {path or '/'}: no value satisfies this schema")


def _subschemas(node: Any, path: str):
    """``(JSON pointer, subschema)`` of every dict subschema, ``not`` and ``if`` excluded (a
    contradiction there makes them match everything or nothing, which is legitimate)."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield from _subschemas(sub, f"{path}/{key}/{_escape(name)}")
    for key in _SUBSCHEMA_LISTS + ("items",):
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield from _subschemas(sub, f"{path}/{key}/{i}")
    for key in _SUBSCHEMAS:
        yield from _subschemas(node.get(key), f"{path}/{key}")


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _contradiction(node: dict[str, Any], validator) -> str | None:
    for low, high in _BOUNDS:
        lo, hi = _number(node.get(low)), _number(node.get(high))
        if lo is not None and hi is not None and lo > hi:
            return f"{low} {lo} > {high} {hi}"
    why = _empty_range(node)
    if why is not None:
        return why
    for key in ("enum", "const"):
        if key in node:
            values = node["enum"] if key == "enum" else [node["const"]]
            rest = {k: v for k, v in node.items() if k not in ("enum", "const")}
            if not isinstance(values, list) or "$ref" in json.dumps(rest):
                continue
            check = validator(rest)
            if not any(check.is_valid(v) for v in values):
                return f"no {key} value satisfies the other keywords of its schema"
    return None


def _empty_range(node: dict[str, Any]) -> str | None:
    """``minimum``/``exclusiveMinimum`` against ``maximum``/``exclusiveMaximum`` (numbers, the
    draft 6+ form) leaving no number."""
    lows = [(k, _number(node.get(k))) for k in ("minimum", "exclusiveMinimum")]
    highs = [(k, _number(node.get(k))) for k in ("maximum", "exclusiveMaximum")]
    for lk, lo in lows:
        for hk, hi in highs:
            if lo is None or hi is None:
                continue
            inclusive = lk == "minimum" and hk == "maximum"
            if lo > hi or (lo == hi and not inclusive):
                return f"{lk} {lo} and {hk} {hi} leave no number"
    return None


def _number(value: Any) -> float | int | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None
