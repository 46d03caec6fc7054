"""Bound the nesting of recursive JSON schemas (a recursive ``$ref`` unrolled to a fixed depth).

A small model asked for a tree keeps opening ``{"children":[{...`` until it runs out of tokens,
so the output never closes. Like outlines-core (which unrolls recursion to depth 3 itself), we
inline recursive local ``$ref``s up to ``max_depth`` uses of the same reference along a path;
one level deeper the reference becomes the ``false`` schema, which is then simplified away:
an optional property is dropped, an array's ``items`` becomes ``maxItems: 0``, an ``anyOf`` /
``oneOf`` branch is removed. Every output of the bounded schema is valid for the original one.
If recursion cannot stop (a required property recurses with no alternative), ``ValueError``.
Schemas without recursion are returned unchanged.
"""

from __future__ import annotations

from typing import Any

from agentlang.runtime.grammar.schema_support import RESTRICTIVE

DEFAULT_MAX_DEPTH = 3
_SCHEMA_VALUED = ("items", "additionalItems", "contains", "not", "if", "then", "else",
                  "propertyNames", "additionalProperties", "unevaluatedItems",
                  "unevaluatedProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_DICTS = ("properties", "patternProperties", "dependentSchemas")


def bound_recursion(schema: dict[str, Any], max_depth: int = DEFAULT_MAX_DEPTH) -> dict[str, Any]:
    if not _is_recursive(schema):
        return schema
    out = _expand(schema, schema, (), max_depth)  # every local $ref is inlined: no $defs left
    if out is False:
        raise ValueError(
            f"json_schema: the recursive $ref never terminates within depth {max_depth} "
            "(give the recursion an optional property, an array, or an anyOf alternative)"
        )
    return out


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    target: Any = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            raise ValueError(f"json_schema: $ref {ref!r} does not resolve")
        target = target[part]
    return target


def _local_refs(node: Any, root: dict[str, Any], into: set[str]) -> None:
    """The local refs reachable from ``node`` through subschemas (not through $ref targets)."""
    for sub in _subschemas(node):
        _local_refs(sub, root, into)
    if isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
        into.add(node["$ref"])


def _is_recursive(root: dict[str, Any]) -> bool:
    edges: dict[str, set[str]] = {}
    top: set[str] = set()
    _local_refs({k: v for k, v in root.items() if k not in ("$defs", "definitions")}, root, top)
    pending, seen = list(top), set()
    while pending:
        ref = pending.pop()
        if ref in seen:
            continue
        seen.add(ref)
        edges[ref] = set()
        _local_refs(_resolve(ref, root), root, edges[ref])
        pending.extend(edges[ref])
    # a cycle exists iff some ref reaches itself
    for start in edges:
        stack, visited = list(edges[start]), set()
        while stack:
            r = stack.pop()
            if r == start:
                return True
            if r not in visited:
                visited.add(r)
                stack.extend(edges.get(r, ()))
    return False


def _subschemas(node: Any):
    if not isinstance(node, dict):
        return
    for key in _SCHEMA_VALUED:
        if key in node:
            yield node[key]
    for key in _SCHEMA_LISTS:
        yield from node.get(key) or ()
    for key in _SCHEMA_DICTS:
        yield from (node.get(key) or {}).values()


def _expand(node: Any, root: dict[str, Any], stack: tuple[str, ...], depth: int) -> Any:
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        if stack.count(ref) >= depth:
            return False
        target = _expand(_resolve(ref, root), root, stack + (ref,), depth)
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        if target is False or not any(k in RESTRICTIVE for k in siblings):
            return target  # annotation siblings (title, description) carry no constraint
        return {**siblings, "allOf": [target]}  # left for schema_support to accept or refuse
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("$defs", "definitions"):
            continue
        if key in _SCHEMA_VALUED:
            out[key] = _expand(value, root, stack, depth)
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_expand(v, root, stack, depth) for v in value]
        elif key in _SCHEMA_DICTS and isinstance(value, dict):
            out[key] = {k: _expand(v, root, stack, depth) for k, v in value.items()}
        else:
            out[key] = value  # enum/const values and annotations are data, not schemas
    return _simplify(out)


def _simplify(node: dict[str, Any]) -> Any:
    """Remove the ``false`` subschemas left by cut-off recursion (see module docstring)."""
    props = node.get("properties")
    if isinstance(props, dict):
        required = set(node.get("required") or ())
        for name in [n for n, v in props.items() if v is False]:
            if name in required:
                return False
            del props[name]
    if node.get("items") is False:  # no items past prefixItems (outlines lacks items: false)
        del node["items"]
        limit = len(node.get("prefixItems") or ())
        if node.get("minItems", 0) > limit:
            return False
        node["maxItems"] = min(node.get("maxItems", limit), limit)
    if False in (node.get("prefixItems") or ()):
        return False
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            node[key] = [b for b in node[key] if b is not False]
            if not node[key]:
                return False
    if node.get("allOf") and False in node["allOf"]:
        return False
    return node
