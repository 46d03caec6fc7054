"""FunctionGemma's argument syntax: a grammar for it from a JSON schema, a parser and a writer.

FunctionGemma (the Gemma 3 270M function-calling model) writes a call as
``<start_function_call>call:NAME{key:VALUE,...}<end_function_call>``: keys bare, every string
value between two ``<escape>`` tokens (so a string may hold ``{``, ``,`` or quotes), numbers,
``true`` / ``false`` / ``null`` as in JSON, objects ``{k:v,...}`` and arrays ``[v,...]`` nested
the same way, no whitespace. Its declarations use the same syntax.

:func:`args_grammar` turns a tool's parameters schema into an EBNF grammar (xgrammar's dialect)
of exactly the arguments object the schema allows — properties in the schema's order, the
required ones always, no others; types, ``enum`` / ``const``, ``anyOf`` / ``oneOf``, nested
objects and arrays (``minItems`` / ``maxItems``) — so a constrained call always parses
(:func:`parse_value`) and validates. Other restrictive keywords are refused by name
(:data:`SUPPORTED`, checked by ``schema_support``) rather than silently not enforced.
"""

from __future__ import annotations

import json
from typing import Any

ESCAPE = "<escape>"
# the restrictive JSON-schema keywords this grammar enforces (schema_support's table)
SUPPORTED = frozenset({"type", "enum", "const", "anyOf", "oneOf", "properties", "required",
                       "items", "minItems", "maxItems", "minimum", "maximum"})
MAX_RANGE = 1024    # an integer's minimum..maximum is spelled out up to this many values


class GemmaArgsError(ValueError):
    """Text that is not FunctionGemma's argument syntax (the message says where)."""


# ---- writing --------------------------------------------------------------------------
def write_value(value: Any) -> str:
    """``value`` (JSON data) in FunctionGemma's syntax."""
    if isinstance(value, str):
        return f"{ESCAPE}{value}{ESCAPE}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{write_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(write_value(v) for v in value) + "]"
    return json.dumps(value)


# ---- parsing --------------------------------------------------------------------------
def parse_value(text: str) -> Any:
    """The JSON data ``text`` (one whole value in FunctionGemma's syntax) stands for."""
    value, end = _value(text, 0)
    if end != len(text):
        raise GemmaArgsError(f"unexpected {text[end:end + 20]!r} at {end}")
    return value


def _value(s: str, i: int) -> tuple[Any, int]:
    if s.startswith(ESCAPE, i):
        j = s.find(ESCAPE, i + len(ESCAPE))
        if j < 0:
            raise GemmaArgsError(f"string opened at {i} is not closed by {ESCAPE}")
        return s[i + len(ESCAPE):j], j + len(ESCAPE)
    if s.startswith("{", i):
        return _items(s, i + 1, "}", keyed=True)
    if s.startswith("[", i):
        return _items(s, i + 1, "]", keyed=False)
    j = i
    while j < len(s) and s[j] not in ",}]":
        j += 1
    try:
        return json.loads(s[i:j]), j
    except json.JSONDecodeError:
        raise GemmaArgsError(f"not a value at {i}: {s[i:j][:20]!r}") from None


def _items(s: str, i: int, close: str, keyed: bool) -> tuple[Any, int]:
    out: Any = {} if keyed else []
    if s.startswith(close, i):
        return out, i + 1
    while True:
        if keyed:
            colon = s.find(":", i)
            if colon < 0:
                raise GemmaArgsError(f"a key at {i} has no ':'")
            key, i = s[i:colon], colon + 1
        value, i = _value(s, i)
        if keyed:
            out[key] = value
        else:
            out.append(value)
        if s.startswith(close, i):
            return out, i + 1
        if not s.startswith(",", i):
            raise GemmaArgsError(f"expected ',' or {close!r} at {i}")
        i += 1


# ---- the grammar --------------------------------------------------------------------------
def string_rules(words: tuple[str, ...]) -> list[str]:
    """Rules ``s0``... of a string's characters: any text in which none of ``words`` occurs
    (each starts with ``<`` and has no other ``<``: the delimiter, a format's markers). The
    states are the trie of the words' proper prefixes; a ``<`` anywhere restarts at "<"; any
    state may end (what follows the string, the delimiter, starts with ``<``, which no partial
    match continues into)."""
    if not words or any(not w.startswith("<") or "<" in w[1:] for w in words):
        raise ValueError(f"excluded words must start with '<' and hold no other: {words!r}")
    prefixes = sorted({w[:i] for w in words for i in range(1, len(w))})
    state = {"": "s0", **{p: f"s{i + 1}" for i, p in enumerate(prefixes)}}
    rules = []
    for p, name in state.items():
        nxt = sorted({w[len(p)] for w in words if w.startswith(p) and len(w) > len(p)} - {"<"})
        alts = ['""', f'"<" {state["<"]}']
        if p:
            alts += [f"{_literal(c)} {state[p + c]}" for c in nxt if p + c in state]
        avoid = "".join(_class_char(c) for c in ["<", *nxt])
        alts.append(f"[^{avoid}] s0")
        rules.append(f"{name} ::= {' | '.join(alts)}")
    return rules


def _class_char(c: str) -> str:
    return "\\" + c if c in "]\\^-[" else c


_BASE = {
    "string": f'"{ESCAPE}" s0 "{ESCAPE}"',
    "integer": '"-"? ("0" | [1-9] [0-9]*)',
    "number": '"-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [+-]? [0-9]+)?',
    "boolean": '"true" | "false"',
    "null": '"null"',
}


def args_grammar(schema: dict, excludes: tuple[str, ...] = ()) -> str:
    """EBNF (root: the arguments object) of the calls ``schema`` allows (module doc); no
    string holds any of ``excludes`` (a format's markers: its parser would stop there)."""
    g = _Grammar()
    root = g.value(schema if schema else {"type": "object"})
    return "\n".join([f"root ::= {root}", *string_rules((ESCAPE, *excludes)),
                      *(f"{k} ::= {v}" for k, v in g.rules.items())])


class _Grammar:
    def __init__(self):
        self.rules: dict[str, str] = {}

    def rule(self, body: str) -> str:
        for name, b in self.rules.items():      # the same body once
            if b == body:
                return name
        name = f"r{len(self.rules)}"
        self.rules[name] = body
        return name

    def value(self, s: Any) -> str:
        if s is True or s == {}:
            return self.any()
        if not isinstance(s, dict):
            raise ValueError(f"json_schema: {s!r} is not a schema")
        if "const" in s:
            return self.rule(_literal(write_value(s["const"])))
        if "enum" in s:
            return self.rule(" | ".join(_literal(write_value(v)) for v in s["enum"]))
        alts = s.get("anyOf") or s.get("oneOf")
        if alts:
            return self.rule(" | ".join(self.value(a) for a in alts))
        t = s.get("type")
        if isinstance(t, list):
            return self.rule(" | ".join(self.value({**s, "type": x}) for x in t))
        if t is None:
            t = "object" if "properties" in s else "array" if "items" in s else None
        if t is None:
            return self.any()
        if t == "object":
            return self.object(s)
        if t == "array":
            return self.array(s)
        if t not in _BASE:
            raise ValueError(f"json_schema: type {t!r} is not one of {sorted(_BASE) + ['array', 'object']}")
        if "minimum" in s or "maximum" in s:
            return self.bounded(s, t)
        return self.rule(_BASE[t])

    def bounded(self, s: dict, t: str) -> str:
        """An integer in ``minimum .. maximum``, each value spelled out (both bounds, at most
        :data:`MAX_RANGE` values); other bounds are refused."""
        lo, hi = s.get("minimum"), s.get("maximum")
        if t != "integer" or not isinstance(lo, int) or not isinstance(hi, int) \
                or not 0 <= hi - lo < MAX_RANGE:
            raise ValueError(f"json_schema: minimum / maximum in FunctionGemma's call syntax "
                             f"only on an integer with both bounds at most {MAX_RANGE} apart, "
                             f"got type {t!r}, minimum {lo!r}, maximum {hi!r}")
        return self.rule(" | ".join(f'"{v}"' for v in range(lo, hi + 1)))

    def object(self, s: dict) -> str:
        props = s.get("properties")
        if not props:
            return self.any_object()
        required = set(s.get("required", ()))
        # after: the properties from k on once one was written (each after a comma);
        # first: the same when none was written yet (a required one may not be skipped)
        after = first = '""'
        for k, v in reversed(list(props.items())):
            prop = self.rule(f"{_literal(k + ':')} {self.value(v)}")
            a, f = f'"," {prop} {after}', f"{prop} {after}"
            if k not in required:
                a, f = f"({a}) | {after}", f"({f}) | {first}"
            after, first = self.rule(a), self.rule(f)
        return self.rule(f'"{{" {first} "}}"')

    def array(self, s: dict) -> str:
        item = self.value(s.get("items", {}))
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        if hi is not None and int(hi) < lo:
            raise ValueError(f"json_schema: maxItems {hi} < minItems {lo}")
        if hi is not None and int(hi) == 0:
            return self.rule('"[" "]"')
        reps = f"{{{max(lo - 1, 0)},}}" if hi is None else f"{{{max(lo - 1, 0)},{int(hi) - 1}}}"
        some = f'"[" {item} ("," {item}){reps} "]"'
        return self.rule(some if lo >= 1 else f'({some}) | "[" "]"')

    def any_object(self) -> str:
        kv = self.rule(f'[a-zA-Z_] [a-zA-Z0-9_]* ":" {self.any()}')
        return self.rule(f'"{{" ({kv} ("," {kv})*)? "}}"')

    def any(self) -> str:
        """Any value (a recursive rule, defined once)."""
        if "any" not in self.rules:
            scalar = " | ".join(f"({_BASE[t]})" for t in ("string", "number", "boolean", "null"))
            self.rules["any_kv"] = '[a-zA-Z_] [a-zA-Z0-9_]* ":" any'
            self.rules["any"] = (f'{scalar} | "{{" (any_kv ("," any_kv)*)? "}}" '
                                 '| "[" (any ("," any)*)? "]"')
        return "any"


def _literal(text: str) -> str:
    """``text`` as an EBNF string literal."""
    return json.dumps(text, ensure_ascii=False)
