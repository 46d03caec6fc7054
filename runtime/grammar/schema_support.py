"""Which JSON-schema keywords each backend enforces; refuse schemas that use any other.

A backend that silently ignored a restrictive keyword (``uniqueItems``, ``not``, number bounds on
outlines, ...) would generate output that fails validation. :func:`check_schema_support` walks
every subschema and raises ``ValueError`` naming the keyword, its location and the backend.
Keywords that only *permit* more (``additionalProperties``: the backends never generate extra
properties) and annotations are always fine; unknown keywords are annotations in JSON Schema.
The support sets were established by compiling each keyword alone and checking that it changes
the grammar and is enforced (tests/grammar/test_grammar_backends.py: ENFORCED, REFUSED_EVERYWHERE).
"""

from __future__ import annotations

from typing import Any

from agentlang.runtime.grammar import gemma_args

# Standard keywords that restrict the set of valid instances.
RESTRICTIVE = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "maxItems", "minItems",
    "uniqueItems", "contains", "maxContains", "minContains", "items", "prefixItems",
    "additionalItems", "unevaluatedItems", "maxProperties", "minProperties", "required",
    "dependentRequired", "dependentSchemas", "dependencies", "properties", "patternProperties",
    "propertyNames", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if", "then",
    "else", "$ref", "$dynamicRef", "$recursiveRef",
})

_COMMON = frozenset({
    "type", "enum", "const", "anyOf", "oneOf", "$ref", "properties", "required", "items",
    "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
})
SUPPORTED = {
    "xgrammar": _COMMON | {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minProperties", "allOf",
    },
    "outlines": _COMMON,
    "functiongemma": gemma_args.SUPPORTED,       # FunctionGemma's call syntax (gemma_args)
}
FORMATS = {
    "xgrammar": frozenset({
        "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
        "uri-reference", "uuid",
    }),
    "outlines": frozenset({"date", "time", "date-time", "email", "uri", "uuid"}),
    "functiongemma": frozenset(),
}

# Keywords whose value is a subschema / a list of subschemas / a dict of subschemas.
_SUB = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames",
        "additionalProperties", "unevaluatedItems", "unevaluatedProperties")
_SUB_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUB_DICT = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def check_schema_support(schema: dict[str, Any], backend: str) -> None:
    """Raise ``ValueError('json_schema: ...')`` if ``schema`` uses a keyword ``backend`` does not
    enforce. Checked beyond plain presence: ``multipleOf`` only on integers with an integer
    step (xgrammar), ``allOf`` only with one subschema (xgrammar), ``oneOf`` only when its
    branches are objects told apart by a required ``const`` property (so "exactly one" holds),
    ``items`` only as a schema (use ``prefixItems`` for tuples)."""
    _walk(schema, backend, "#", schema)


def _walk(node: Any, backend: str, path: str, root: dict[str, Any]) -> None:
    if not isinstance(node, dict):
        return  # boolean schemas and non-schema values
    for key in node:
        if key in RESTRICTIVE and key not in SUPPORTED[backend]:
            _refuse(backend, path, key)
    if "format" in node and node["format"] not in FORMATS[backend]:
        _refuse(backend, path, "format", f"format {node['format']!r}")
    _check_combinations(node, backend, path)
    if "multipleOf" in node and not (
        node.get("type") == "integer" and isinstance(node["multipleOf"], int)
    ):
        _refuse(backend, path, "multipleOf", "multipleOf on a non-integer type or step")
    if "allOf" in node and len(node["allOf"]) != 1:
        _refuse(backend, path, "allOf", "allOf with more than one subschema")
    if "oneOf" in node and not _discriminated(node["oneOf"], root):
        _refuse(backend, path, "oneOf", "oneOf whose branches may overlap (use anyOf, or give "
                "every branch a required property with a distinct const)")
    if isinstance(node.get("items"), list):
        _refuse(backend, path, "items", "items as a list (use prefixItems)")
    for key in _SUB:
        if key in node:
            _walk(node[key], backend, f"{path}/{key}", root)
    for key in _SUB_LIST:
        for i, sub in enumerate(node.get(key) or ()):
            _walk(sub, backend, f"{path}/{key}/{i}", root)
    for key in _SUB_DICT:
        for name, sub in (node.get(key) or {}).items():
            _walk(sub, backend, f"{path}/{key}/{name}", root)


# Keywords that replace the node's grammar: restrictive siblings would be silently ignored.
_EXCLUSIVE = ("enum", "const", "anyOf", "oneOf", "allOf", "$ref")


def _check_combinations(node: dict[str, Any], backend: str, path: str) -> None:
    """Both backends build one grammar per keyword family and drop the rest: an ``enum`` with a
    ``maximum``, a ``pattern`` with a ``maxLength``, an ``anyOf`` with sibling ``minimum``...
    Such combinations are refused (the caller can fold the siblings into the branches)."""
    restrictive = [k for k in node if k in RESTRICTIVE]
    for key in _EXCLUSIVE:
        if key not in node:
            continue
        others = [k for k in restrictive if k != key and not (k == "type" and _type_redundant(node))]
        if others:
            _refuse(backend, path, key, f"{key} combined with {', '.join(others)}")
    string_rules = [k for k in ("format", "pattern", "minLength", "maxLength") if k in node]
    if ("format" in node or "pattern" in node) and len(string_rules) > 1:
        _refuse(backend, path, string_rules[0], f"{' + '.join(string_rules)} on one string")


def _type_redundant(node: dict[str, Any]) -> bool:
    """``type`` next to ``enum``/``const`` adds nothing when every value already has that type."""
    if "enum" not in node and "const" not in node:
        return False
    values = node["enum"] if "enum" in node else [node["const"]]
    types = node["type"] if isinstance(node["type"], list) else [node["type"]]
    return all(any(_has_type(v, t) for t in types) for v in values)


def _has_type(value: Any, t: str) -> bool:
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    python = {"string": str, "boolean": bool, "null": type(None), "array": list, "object": dict}
    return isinstance(value, python.get(t, ()))


def _refuse(backend: str, path: str, key: str, what: str | None = None) -> None:
    raise ValueError(
        f"json_schema: {what or 'keyword ' + repr(key)} at {path} is not supported by the "
        f"{backend} backend"
    )


def _discriminated(branches: list[Any], root: dict[str, Any]) -> bool:
    """True when some property is required with a ``const`` (or one-value ``enum``) in every
    branch, all distinct. Branches may be local ``$ref``s (pydantic discriminated unions)."""
    resolved = [_resolve(b, root) for b in branches]
    if not resolved or not all(isinstance(b, dict) for b in resolved):
        return False
    consts: list[dict[str, str]] = []
    for b in resolved:
        props = b.get("properties") or {}
        consts.append({
            k: repr(_const(props.get(k))) for k in b.get("required") or ()
            if _const(props.get(k)) is not _NO_CONST
        })
    for key in set.intersection(*(set(c) for c in consts)):
        values = [c[key] for c in consts]
        if len(set(values)) == len(values):
            return True
    return False


_NO_CONST = object()


def _const(prop: Any) -> Any:
    prop = prop if isinstance(prop, dict) else {}
    if "const" in prop:
        return prop["const"]
    if isinstance(prop.get("enum"), list) and len(prop["enum"]) == 1:
        return prop["enum"][0]
    return _NO_CONST


def _resolve(node: Any, root: dict[str, Any]) -> Any:
    """Follow a local ``{"$ref": "#/..."}`` (JSON pointer into ``root``); else ``node``."""
    for _ in range(32):  # ref chains, bounded
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)
                and node["$ref"].startswith("#")):
            return node
        target: Any = root
        for part in node["$ref"][1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                return None
            target = target[part]
        node = target
    return None
