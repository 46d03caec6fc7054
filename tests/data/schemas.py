"""The 20-schema validity set (issue 6) with one valid compact instance each.

Each entry: (name, schema, instance). The instance is written in the order the backends generate
(properties in schema order, no whitespace) so tests can drive matchers with its tokens.
``OUTLINES_UNSUPPORTED`` lists the entries outlines-core cannot enforce (number bounds,
multipleOf), which must fail with a clear ValueError rather than be silently relaxed.
"""

from __future__ import annotations

SCHEMAS: list[tuple[str, dict, str]] = [
    ("person_bounds", {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    }, '{"name":"Ada","age":36}'),
    ("nested_address", {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                               "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "city", "zip"],
            },
        },
        "required": ["name", "address"],
    }, '{"name":"Bo","address":{"street":"Main St","city":"Oslo","zip":"01234"}}'),
    ("tags_min_max", {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
    }, '{"tags":["a","b"]}'),
    ("enums", {
        "type": "object",
        "properties": {"status": {"enum": ["active", "inactive", "pending"]},
                       "priority": {"type": "integer", "enum": [1, 2, 3]}},
        "required": ["status", "priority"],
    }, '{"status":"pending","priority":2}'),
    ("any_of", {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                       "parent": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
        "required": ["value", "parent"],
    }, '{"value":7,"parent":null}'),
    ("number_bounds", {
        "type": "object",
        "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 50},
                       "humidity": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["temperature", "humidity"],
    }, '{"temperature":21.5,"humidity":40}'),
    ("string_patterns", {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                       "phone": {"type": "string", "pattern": "^\\+?[0-9]{2,3}-[0-9]{3}-[0-9]{4}$"}},
        "required": ["code", "phone"],
    }, '{"code":"ABC-1234","phone":"+12-555-0100"}'),
    ("optional_fields", {
        "type": "object",
        "properties": {"title": {"type": "string"}, "subtitle": {"type": "string"},
                       "pages": {"type": "integer"}, "draft": {"type": "boolean"}},
        "required": ["title"],
    }, '{"title":"Notes","pages":12}'),
    ("recursive_tree", {
        "$defs": {"node": {
            "type": "object",
            "properties": {"value": {"type": "integer"},
                           "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
            "required": ["value", "children"],
        }},
        "$ref": "#/$defs/node",
    }, '{"value":1,"children":[{"value":2,"children":[]}]}'),
    ("bool_null", {
        "type": "object",
        "properties": {"enabled": {"type": "boolean"}, "note": {"type": "null"},
                       "score": {"type": ["number", "null"]}},
        "required": ["enabled", "note", "score"],
    }, '{"enabled":true,"note":null,"score":null}'),
    ("array_of_objects", {
        "type": "object",
        "properties": {"items": {
            "type": "array", "minItems": 1, "maxItems": 2,
            "items": {"type": "object",
                      "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
                      "required": ["name", "qty"]},
        }},
        "required": ["items"],
    }, '{"items":[{"name":"pen","qty":3}]}'),
    ("const_field", {
        "type": "object",
        "properties": {"kind": {"const": "event"}, "name": {"type": "string"}},
        "required": ["kind", "name"],
    }, '{"kind":"event","name":"launch"}'),
    ("formats", {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"},
                       "id": {"type": "string", "format": "uuid"}},
        "required": ["day", "id"],
    }, '{"day":"2024-05-17","id":"123e4567-e89b-12d3-a456-426614174000"}'),
    ("matrix", {
        "type": "object",
        "properties": {"rows": {"type": "array", "maxItems": 2,
                                "items": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}}},
        "required": ["rows"],
    }, '{"rows":[[1,2],[3]]}'),
    ("tuple_point", {
        "type": "object",
        "properties": {"point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]}},
        "required": ["point"],
    }, '{"point":[1.5,-2]}'),
    ("defs_reuse", {
        "$defs": {"money": {"type": "object",
                            "properties": {"amount": {"type": "number"}, "currency": {"enum": ["USD", "EUR"]}},
                            "required": ["amount", "currency"]}},
        "type": "object",
        "properties": {"price": {"$ref": "#/$defs/money"}, "tax": {"$ref": "#/$defs/money"}},
        "required": ["price", "tax"],
    }, '{"price":{"amount":10,"currency":"EUR"},"tax":{"amount":2.5,"currency":"EUR"}}'),
    ("string_lengths", {
        "type": "object",
        "properties": {"username": {"type": "string", "minLength": 3, "maxLength": 8}},
        "required": ["username"],
    }, '{"username":"alice"}'),
    ("discriminated_one_of", {
        "type": "object",
        "properties": {"shape": {"oneOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number"}},
             "required": ["kind", "radius"]},
            {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
             "required": ["kind", "side"]},
        ]}},
        "required": ["shape"],
    }, '{"shape":{"kind":"square","side":2}}'),
    ("multiple_of_exclusive", {
        "type": "object",
        "properties": {"count": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
                       "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
        "required": ["count", "ratio"],
    }, '{"count":15,"ratio":0.25}'),
    ("deep_nesting", {
        "type": "object",
        "properties": {"company": {"type": "object", "properties": {
            "name": {"type": "string"},
            "ceo": {"type": "object", "properties": {
                "name": {"type": "string"},
                "contact": {"type": "object", "properties": {"level": {"enum": ["junior", "senior"]},
                                                             "phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}},
                            "required": ["level", "phone"]},
            }, "required": ["name", "contact"]},
        }, "required": ["name", "ceo"]}},
        "required": ["company"],
    }, '{"company":{"name":"Acme","ceo":{"name":"Wile","contact":{"level":"senior","phone":"555-0100"}}}}'),
]

OUTLINES_UNSUPPORTED = {"person_bounds", "number_bounds", "multiple_of_exclusive"}

# A key-heavy schema (>= 8 fixed keys) for jump-forward checks.
KEY_HEAVY = {
    "type": "object",
    "properties": {k: {"type": t} for k, t in [
        ("first_name", "string"), ("last_name", "string"), ("age", "integer"),
        ("is_student", "boolean"), ("home_city", "string"), ("home_country", "string"),
        ("favourite_colour", "string"), ("number_of_pets", "integer"),
    ]},
    "required": ["first_name", "last_name", "age", "is_student", "home_city", "home_country",
                 "favourite_colour", "number_of_pets"],
}

# A Lark arithmetic grammar (precedence, unary minus, parentheses, inline whitespace).
CALC = """
?start: sum
?sum: product | sum "+" product | sum "-" product
?product: atom | product "*" atom | product "/" atom
?atom: NUMBER | "-" atom | "(" sum ")"
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""
