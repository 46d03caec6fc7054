"""Deterministic sample values for the Mock backend: a string matching a regex, an instance
of a JSON schema, a sentence of a Lark grammar. Each takes a ``random.Random`` so the Mock's
answers depend only on the prompt."""

from __future__ import annotations

import json
import random
import re
import string
from typing import Any

try:  # Python >= 3.11
    import re._constants as sre_c  # type: ignore[import-not-found]
    import re._parser as sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

_CATEGORY_CHARS = {
    sre_c.CATEGORY_DIGIT: string.digits, sre_c.CATEGORY_NOT_DIGIT: string.ascii_lowercase,
    sre_c.CATEGORY_WORD: string.ascii_lowercase + string.digits,
    sre_c.CATEGORY_NOT_WORD: " .,-", sre_c.CATEGORY_SPACE: " ",
    sre_c.CATEGORY_NOT_SPACE: string.ascii_lowercase,
}
_PRINTABLE = string.ascii_letters + string.digits + " .,-_"


def _in_set(items: list, rng: random.Random) -> str:
    negate = any(op == sre_c.NEGATE for op, _ in items)
    allowed: list[str] = []
    for op, av in items:
        if op == sre_c.LITERAL:
            allowed.append(chr(av))
        elif op == sre_c.RANGE:
            allowed.extend(chr(c) for c in range(av[0], min(av[1], av[0] + 25) + 1))
        elif op == sre_c.CATEGORY:
            allowed.extend(_CATEGORY_CHARS.get(av, "a"))
    if negate:
        allowed = [c for c in _PRINTABLE if c not in allowed]
    return rng.choice(allowed) if allowed else "a"


def _emit(pattern, rng: random.Random, groups: dict[int, str]) -> str:
    out = []
    for op, av in pattern:
        if op == sre_c.LITERAL:
            out.append(chr(av))
        elif op == sre_c.NOT_LITERAL:
            out.append(next(c for c in _PRINTABLE if ord(c) != av))
        elif op == sre_c.ANY:
            out.append(rng.choice(string.ascii_lowercase))
        elif op == sre_c.IN:
            out.append(_in_set(av, rng))
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, sub = av
            hi = lo + 3 if hi == sre_c.MAXREPEAT else hi
            out.extend(_emit(sub, rng, groups) for _ in range(rng.randint(lo, max(lo, min(hi, lo + 3)))))
        elif op == sre_c.BRANCH:
            out.append(_emit(rng.choice(av[1]), rng, groups))
        elif op == sre_c.SUBPATTERN:
            gid, sub = av[0], av[-1]
            text = _emit(sub, rng, groups)
            if gid is not None:
                groups[gid] = text
            out.append(text)
        elif op == sre_c.GROUPREF:
            out.append(groups.get(av, ""))
        elif op == sre_c.CATEGORY:
            out.append(_CATEGORY_CHARS.get(av, "a")[0])
        # AT (anchors), ASSERT, ASSERT_NOT: emit nothing
    return "".join(out)


def sample_regex(regex: str, rng: random.Random, prefer: str | None = None) -> str:
    """A string fully matching ``regex`` (``prefer`` if it already matches)."""
    compiled = re.compile(regex)
    if prefer is not None and compiled.fullmatch(prefer):
        return prefer
    parsed = sre_parse.parse(regex)
    for _ in range(50):
        text = _emit(parsed, rng, {})
        if compiled.fullmatch(text):
            return text
    raise ValueError(f"Mock cannot produce a string matching regex {regex!r}")


def _resolve(schema: dict, root: dict) -> dict:
    while "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"Mock cannot resolve $ref {ref!r}")
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        schema = node
    return schema


def sample_schema(schema: dict, rng: random.Random, root: dict | None = None) -> Any:
    """A deterministic instance of a JSON schema (the common subset: types, properties,
    required, enum, const, anyOf/oneOf/allOf, items, min/max, pattern, $ref)."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if _resolve(o, root).get("type") != "null"]
            return sample_schema(rng.choice(options or schema[key]), rng, root)
    if "allOf" in schema:
        merged: dict = {}
        for part in schema["allOf"]:
            merged.update(_resolve(part, root))
        return sample_schema(merged, rng, root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties", {})
        return {k: sample_schema(v, rng, root) for k, v in props.items()}
    if kind == "array":
        n = max(schema.get("minItems", 1), 1)
        n = min(n, schema.get("maxItems", n))
        items = schema.get("items", {"type": "string"})
        if "prefixItems" in schema:
            return [sample_schema(s, rng, root) for s in schema["prefixItems"]]
        return [sample_schema(items, rng, root) for _ in range(n)]
    if kind == "string":
        if "pattern" in schema:
            return sample_regex(schema["pattern"], rng)
        lo, hi = schema.get("minLength", 1), schema.get("maxLength", 12)
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(max(lo, min(6, hi))))
        return word[:hi]
    if kind == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        hi = schema.get("maximum", schema.get("exclusiveMaximum", lo + 100) - 1)
        return rng.randint(int(lo), int(max(lo, hi)))
    if kind == "number":
        lo = schema.get("minimum", 0.0)
        hi = schema.get("maximum", lo + 100.0)
        return round(rng.uniform(lo, hi), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    raise ValueError(f"Mock cannot sample JSON schema type {kind!r}")


def sample_json(schema: dict, rng: random.Random, prefer: str | None = None) -> str:
    """JSON text of an instance of ``schema`` (``prefer`` if it parses and validates)."""
    import jsonschema

    if prefer is not None:
        try:
            value = json.loads(prefer)
            jsonschema.validate(value, schema)
            return prefer
        except (ValueError, jsonschema.ValidationError):
            pass
    return json.dumps(sample_schema(schema, rng))


def sample_grammar(grammar: str, rng: random.Random) -> str:
    """A sentence of a Lark grammar (shortest derivations; checked by parsing it)."""
    import lark

    parser = lark.Lark(grammar, start="start", parser="earley")
    terminals = {t.name: t.pattern for t in parser.terminals}
    ignored = set(parser.ignore_tokens)
    rules: dict[str, list[list[str]]] = {}
    for rule in parser.rules:
        rules.setdefault(rule.origin.name, []).append([s.name for s in rule.expansion])
    depth: dict[str, float] = {name: 1 for name in terminals}
    for _ in range(len(rules) + 2):  # fixpoint: minimal derivation depth per rule
        for name, expansions in rules.items():
            depth[name] = min(1 + max((depth.get(s, float("inf")) for s in exp), default=0)
                              for exp in expansions)

    def emit(symbol: str, budget: int) -> str:
        if symbol in terminals:
            pattern = terminals[symbol]
            if pattern.type == "str":
                return pattern.value
            return sample_regex(pattern.to_regexp(), rng)
        options = rules[symbol]
        if budget > 0:
            exp = rng.choice(options)
            if any(depth.get(s, float("inf")) == float("inf") for s in exp):
                exp = min(options, key=lambda e: max((depth[s] for s in e), default=0))
        else:
            exp = min(options, key=lambda e: max((depth[s] for s in e), default=0))
        sep = " " if ignored else ""
        return sep.join(emit(s, budget - 1) for s in exp)

    for _ in range(20):
        text = emit("start", 6)
        try:
            parser.parse(text)
            return text
        except lark.exceptions.LarkError:
            continue
    raise ValueError("Mock cannot produce a sentence of the given grammar")
