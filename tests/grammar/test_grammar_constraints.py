"""Constraint normalization and validation (runtime/grammar/constraints.py); no tokenizer."""

from __future__ import annotations

import json

import pydantic
import pytest

from data.schemas import CALC
from agentlang.runtime.grammar.constraints import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    Constraint,
    constraint_from_params,
)



class Point(pydantic.BaseModel):
    x: int
    y: float
    label: str | None = None


def test_nothing_set_is_none():
    assert constraint_from_params() is None


def test_sglang_type_regexes():
    assert REGEX_INT == r"[-+]?[0-9]+[ \n]*"
    assert REGEX_FLOAT == r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
    assert REGEX_BOOL == r"(True|False)"
    assert REGEX_STR == r"\"[\w\d\s]*\""
    for name, regex in [("int", REGEX_INT), ("float", REGEX_FLOAT), ("bool", REGEX_BOOL),
                        ("str", REGEX_STR)]:
        c = constraint_from_params(value_type=name)
        assert c == Constraint("type", name) and c.type_regex() == regex


def test_json_schema_forms_normalize_to_one_constraint():
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    from_dict = constraint_from_params(json_schema=schema)
    from_str = constraint_from_params(json_schema=json.dumps(schema, indent=4))
    assert from_dict == from_str and hash(from_dict) == hash(from_str)
    assert from_dict.kind == "json_schema" and from_dict.json_indent is None
    assert list(from_dict.schema()["properties"]) == ["b", "a"]  # generation order is kept
    assert {from_dict: 1}[from_str] == 1
    indented = constraint_from_params(json_schema=schema, json_indent=2)
    assert indented != from_dict and indented.json_indent == 2


def test_pydantic_model_uses_model_json_schema():
    c = constraint_from_params(json_schema=Point)
    assert c.schema() == Point.model_json_schema()


def test_other_kinds():
    assert constraint_from_params(regex=r"\d+") == Constraint("regex", r"\d+")
    c = constraint_from_params(choices=["yes", "no", "ça va"])
    assert c.kind == "choices" and c.choice_list() == ["yes", "no", "ça va"]
    g = constraint_from_params(grammar=CALC)
    assert g == Constraint("grammar", CALC)


@pytest.mark.parametrize("kwargs, field, reason", [
    (dict(json_schema={"type": "object"}, regex="a"), "json_schema, regex", "only one of"),
    (dict(choices=["a"], value_type="int"), "choices, value_type", "only one of"),
    (dict(json_schema={"type": "strng"}), "json_schema", "invalid JSON schema"),
    (dict(json_schema={"type": "object", "properties": {"a": {"minimum": "zero"}}}),
     "json_schema", "properties/a/minimum"),
    (dict(json_schema='{"type": "object",'), "json_schema", "not valid JSON at line 1"),
    (dict(json_schema=[1, 2]), "json_schema", "must be a JSON object"),
    (dict(json_schema=int), "json_schema", "pydantic BaseModel"),
    (dict(regex="(ab"), "regex", "position 0"),
    (dict(regex="a{2,1}"), "regex", "position"),
    (dict(regex=""), "regex", "empty"),
    (dict(choices=[]), "choices", "must not be empty"),
    (dict(choices=["a", 3]), "choices", "item 1 is int"),
    (dict(choices="abc"), "choices", "list of strings"),
    (dict(value_type="double"), "value_type", "accepted: int, float, bool, str"),
    (dict(grammar='start: "a" (\n'), "grammar", "line 1 column"),
    (dict(grammar='start: "a"\nfoo: bar\n'), "grammar", "line 2, column 6"),
    (dict(grammar="start: x\n"), "grammar", "line 1, column 8"),
    (dict(grammar="start \"x\"\n"), "grammar", "line 1 column 7"),
    (dict(grammar="start: A\nA: /[/\n"), "grammar", "unterminated character set"),
    (dict(json_indent=2), "json_indent", "only applies together with json_schema"),
    (dict(json_schema={"type": "object"}, json_indent=-1), "json_indent", "non-negative"),
])
def test_bad_input_names_field_and_reason(kwargs, field, reason):
    with pytest.raises(ValueError) as info:
        constraint_from_params(**kwargs)
    msg = str(info.value)
    assert field in msg and reason in msg, msg
