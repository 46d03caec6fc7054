"""Grammar backends with the real SmolLM2 tokenizer, driven by the tokens of known strings
(no model forward): masks, special tokens, termination, jump-forward text, rollback, every
constraint kind, the 20-schema set on both backends, schema-support refusals."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

import data.schemas as S
from agentlang.runtime.grammar import BACKENDS, constraint_from_params, make_grammar_backend
from agentlang.runtime.grammar.base import bitmask_allows, bitmask_width, ids_to_bitmask_row

VOCAB_SIZE = 49152


CALC = S.CALC
IPV4 = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"
ISO_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


@pytest.fixture(scope="module")
def backends(tokenizer):
    return {name: make_grammar_backend(name, tokenizer, VOCAB_SIZE) for name in BACKENDS}


def compile_(backends, name, **params):
    return backends[name].compile(constraint_from_params(**params))


def drive(matcher, tokenizer, text: str) -> bool:
    """Accept the tokens of ``text``, checking each was in the mask; False at the first reject."""
    vocab = matcher.vocab
    special = ids_to_bitmask_row(vocab.special_ids, vocab.vocab_size)
    row = torch.zeros(1, bitmask_width(vocab.vocab_size), dtype=torch.int32)
    for t in tokenizer.encode(text, add_special_tokens=False):
        matcher.fill_mask(row, 0)
        assert not (row[0] & special).any(), "a special token is allowed"
        if not bitmask_allows(row[0], t):
            assert not matcher.accept_token(t)
            return False
        assert matcher.accept_token(t)
    return True


def assert_complete(matcher, *, can_continue: bool = False):
    stop = set(matcher.vocab.stop_ids)
    allowed = set(matcher.allowed_token_ids())
    assert stop <= allowed
    assert matcher.is_terminated() == (not can_continue)
    if not can_continue:
        assert allowed == stop
    assert matcher.accept_token(matcher.vocab.stop_ids[0])
    assert matcher.is_terminated() and matcher.allowed_token_ids() == []
    assert not matcher.accept_token(100)  # nothing after the stop token


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, schema, instance", S.SCHEMAS, ids=[s[0] for s in S.SCHEMAS])
def test_schema_instance_drives_matcher_to_completion(backends, tokenizer, backend, name, schema,
                                                      instance):
    validator = jsonschema.validators.validator_for(schema)
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(json.loads(instance))
    if backend == "outlines" and name in S.OUTLINES_UNSUPPORTED:
        with pytest.raises(ValueError, match="json_schema: .* not supported by the outlines"):
            compile_(backends, backend, json_schema=schema)
        return
    m = compile_(backends, backend, json_schema=schema).new_matcher()
    assert m.vocab.stop_ids[0] not in m.allowed_token_ids()  # empty output is not valid JSON
    assert drive(m, tokenizer, instance)
    assert_complete(m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forbidden_tokens_are_rejected_without_state_change(backends, tokenizer, backend):
    m = compile_(backends, backend, json_schema=S.KEY_HEAVY).new_matcher()
    before = m.allowed_token_ids()
    x = tokenizer.encode("x", add_special_tokens=False)[0]
    for t in [x, 0, 1, 3, 16, m.vocab.stop_ids[0], -1, VOCAB_SIZE]:
        assert not m.accept_token(t), t
    assert m.allowed_token_ids() == before and m.num_accepted == 0
    assert drive(m, tokenizer, '{"first_name":"')
    inside_string = set(m.allowed_token_ids())
    assert len(inside_string) > 10000  # free text: almost the whole vocabulary...
    assert not inside_string & (m.vocab.special_ids | set(m.vocab.stop_ids))  # ...but no specials


@pytest.mark.parametrize("backend", BACKENDS)
def test_jump_forward_text_on_key_heavy_schema(backends, tokenizer, backend):
    m = compile_(backends, backend, json_schema=S.KEY_HEAVY).new_matcher()
    steps = [
        ("", '{"first_name":"'),
        ('{"first_name":"John"', ',"last_name":"'),
        (',"last_name":"Doe","age":25', ""),  # more digits may follow
        (',"is_student":', ""),  # true or false
        ("t", 'rue,"home_city":"'),
        ('rue,"home_city":"Oslo","home_country":"Norway","favourite_colour":"red"',
         ',"number_of_pets":'),
        (',"number_of_pets":2}', ""),
    ]
    for text, forced in steps:
        assert drive(m, tokenizer, text)
        assert m.jump_forward_text() == forced, (text, m.jump_forward_text())
    assert m.is_terminated()


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollback(backends, tokenizer, backend):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    m = compile_(backends, backend, json_schema=schema).new_matcher()
    ids = tokenizer.encode('{"name":"Ada","age":36}', add_special_tokens=False)
    masks = []
    for t in ids:
        masks.append(m.allowed_token_ids())
        assert m.accept_token(t)
    assert m.num_accepted == len(ids) and m.is_terminated()
    with pytest.raises(ValueError, match="num_tokens"):
        m.rollback(len(ids) + 1)
    m.rollback(3)
    assert m.num_accepted == len(ids) - 3 and not m.is_terminated()
    assert m.allowed_token_ids() == masks[-3]
    for t in ids[-3:]:
        assert m.accept_token(t)
    assert m.accept_token(m.vocab.stop_ids[0]) and m.allowed_token_ids() == []
    m.rollback(1)  # undo the stop token: complete again, only the stop token may follow
    assert m.is_terminated() and m.allowed_token_ids() == list(m.vocab.stop_ids)
    m.rollback(m.num_accepted)
    assert m.allowed_token_ids() == masks[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("regex, good, bad", [
    (IPV4, ["192.168.0.1", "8.8.8.8", "255.255.255.255"], ["256.1.1.1", "1.2.3", "1.2.3.4.5"]),
    (ISO_DATE, ["2024-02-29", "1999-12-31"], ["2024-13-01", "2024-1-01", "2024-01-32"]),
    (PHONE, ["(555) 123-4567"], ["555-123-4567", "(555)123-4567"]),
    (r"^[a-z]+\d$", ["abc1"], ["abc", "1"]),  # anchors are no-ops under full match
])
def test_regex(backends, tokenizer, backend, regex, good, bad):
    compiled = compile_(backends, backend, regex=regex)
    for text in good:
        m = compiled.new_matcher()
        assert drive(m, tokenizer, text), text
        assert m.vocab.stop_ids[0] in m.allowed_token_ids(), text
    for text in bad:
        m = compiled.new_matcher()
        assert not (drive(m, tokenizer, text) and m.vocab.stop_ids[0] in m.allowed_token_ids())


@pytest.mark.parametrize("backend", BACKENDS)
def test_choices(backends, tokenizer, backend):
    compiled = compile_(backends, backend, choices=["yes", "no", "maybe (later)"])
    for choice in ["yes", "no", "maybe (later)"]:
        m = compiled.new_matcher()
        assert drive(m, tokenizer, choice)
        assert_complete(m)
    m = compiled.new_matcher()
    assert drive(m, tokenizer, "may") and not m.is_terminated()
    assert m.jump_forward_text() == "be (later)"
    assert not drive(compiled.new_matcher(), tokenizer, "yesno")
    prefixed = compile_(backends, backend, choices=["a", "ab"]).new_matcher()
    assert drive(prefixed, tokenizer, "a")
    # outlines-core drops the transitions out of a final state (see outlines_backend docstring)
    assert_complete(prefixed, can_continue=backend == "xgrammar")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value_type, good, bad", [
    ("int", ["-42", "+7", "12 "], ["4.2", "x"]),
    ("float", ["3.14", "-.5", "2"], ["1e5", "1.2.3"]),
    ("bool", ["True", "False"], ["true", "Tru e"]),
    ("str", ['"hello world 42"'], ['"a-b"', "hello"]),
])
def test_value_types(backends, tokenizer, backend, value_type, good, bad):
    if backend == "outlines" and value_type == "float":
        good = [g for g in good if g != "3.14"]  # outlines-core: no "." after a final "3"
    compiled = compile_(backends, backend, value_type=value_type)
    for text in good:
        m = compiled.new_matcher()
        assert drive(m, tokenizer, text) and m.vocab.stop_ids[0] in m.allowed_token_ids(), text
    for text in bad:
        m = compiled.new_matcher()
        assert not (drive(m, tokenizer, text) and m.vocab.stop_ids[0] in m.allowed_token_ids())


def test_json_indent_xgrammar(backends, tokenizer):
    name, schema, instance = S.SCHEMAS[1]
    compiled = compile_(backends, "xgrammar", json_schema=schema, json_indent=2)
    m = compiled.new_matcher()
    assert drive(m, tokenizer, json.dumps(json.loads(instance), indent=2))
    assert_complete(m)
    assert not drive(compiled.new_matcher(), tokenizer, instance)  # compact is not indented


def test_lark_grammar_xgrammar(backends, tokenizer):
    compiled = compile_(backends, "xgrammar", grammar=CALC)
    m = compiled.new_matcher()
    assert drive(m, tokenizer, "(1 + 2.5) * -3")
    assert_complete(m, can_continue=True)  # "3" may grow into "31" or "3 + 1"
    m = compiled.new_matcher()
    assert drive(m, tokenizer, "(1 + 2)")
    assert not drive(m, tokenizer, "(")  # "(1 + 2)(" is not an expression


@pytest.mark.parametrize("backend, params, reason", [
    ("outlines", dict(grammar=CALC), "grammar: Lark grammars are not supported by the outlines"),
    ("outlines", dict(json_schema={"type": "object"}, json_indent=2), "json_indent: indented"),
    ("outlines", dict(json_schema={"type": "integer", "minimum": 1}), "keyword 'minimum' at #"),
    ("outlines", dict(json_schema={"type": "string", "format": "ipv4"}), "format 'ipv4'"),
    ("outlines", dict(regex=r"(?=a)a"), "regex: not supported by the outlines backend"),
    ("xgrammar", dict(regex=r"(?=a)a"), "regex: not supported by the xgrammar backend"),
    ("xgrammar", dict(json_schema={"type": "string", "format": "iri"}), "format 'iri'"),
    ("xgrammar", dict(grammar='start: A\nA: /a(?=b)/\n'), "grammar: terminal A: lookahead"),
])
def test_backend_refusals_name_the_field(backends, backend, params, reason):
    with pytest.raises(ValueError) as info:
        compile_(backends, backend, **params)
    assert reason in str(info.value), str(info.value)


REFUSED_EVERYWHERE = [  # (schema, reason); outlines may name an unsupported keyword first
    ({"type": "array", "uniqueItems": True}, "keyword 'uniqueItems' at #"),
    ({"type": "object", "properties": {"a": {"not": {"const": 1}}}}, "keyword 'not' at #/properties/a"),
    ({"anyOf": [{"type": "integer"}], "minItems": 3}, "anyOf combined with minItems"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf whose branches may overlap"),
    ({"enum": [1, 10], "maxItems": 5}, "enum combined with maxItems"),
    ({"type": "string", "enum": ["a", 1]}, "enum combined with type"),
    ({"type": "string", "pattern": "[a-z]+", "maxLength": 3}, "pattern + maxLength"),
    ({"type": "string", "format": "email", "maxLength": 30}, "format + maxLength"),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
      "items": [{"type": "integer"}]}, "items as a list"),
    ({"type": "object", "maxProperties": 1}, "keyword 'maxProperties'"),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}}, "keyword 'dependentRequired'"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ({"allOf": [{"type": "integer"}, {"minimum": 1}]}, "allOf"),
    ({"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
                      "required": ["x"]}}, "$ref": "#/$defs/a"}, "never terminates"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema, reason", REFUSED_EVERYWHERE)
def test_unenforceable_schemas_are_refused(backends, backend, schema, reason):
    with pytest.raises(ValueError) as info:
        compile_(backends, backend, json_schema=schema)
    assert str(info.value).startswith("json_schema:") and reason in str(info.value), str(info.value)


ENFORCED = [  # (schema, valid instance, invalid instance, backends)
    ({"type": "integer", "minimum": 5, "maximum": 70}, "64", "71", ["xgrammar"]),
    ({"type": "integer", "exclusiveMinimum": 0}, "1", "0", ["xgrammar"]),
    ({"type": "number", "minimum": 0.5, "maximum": 2.25}, "2.2", "2.3", ["xgrammar"]),
    ({"type": "integer", "multipleOf": 5}, "15", "12", ["xgrammar"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "minProperties": 2}, '{"a":1,"b":2}', '{"a":1}', ["xgrammar"]),
    ({"allOf": [{"type": "integer", "maximum": 3}]}, "3", "4", ["xgrammar"]),
    ({"type": "string", "minLength": 2, "maxLength": 3}, '"abc"', '"abcd"', BACKENDS),
    ({"type": "string", "pattern": "^[a-z]{2}$"}, '"ab"', '"abc"', BACKENDS),
    ({"type": "string", "format": "date"}, '"2024-01-31"', '"31.01.2024"', BACKENDS),
    ({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"', '"zz"', BACKENDS),
    ({"type": "string", "format": "ipv4"}, '"10.0.0.1"', '"10.0.0"', ["xgrammar"]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, "[1,2]",
     "[1,2,3,4]", BACKENDS),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}, '[1,"a"]',
     '[1,2]', BACKENDS),
    ({"type": "integer", "enum": [1, 2, 3]}, "2", "4", BACKENDS),
    ({"type": ["integer", "null"]}, "null", '"a"', BACKENDS),
    ({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                {"type": "object", "properties": {"k": {"enum": ["b"]}, "n": {"type": "integer"}},
                 "required": ["k", "n"]}]}, '{"k":"b","n":1}', '{"k":"c"}', BACKENDS),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, '{"a":1}',
     "{}", BACKENDS),
]


@pytest.mark.parametrize("schema, good, bad, names", ENFORCED)
def test_supported_keywords_are_enforced(backends, tokenizer, schema, good, bad, names):
    for backend in names:
        compiled = compile_(backends, backend, json_schema=schema)
        m = compiled.new_matcher()
        assert drive(m, tokenizer, good) and m.vocab.stop_ids[0] in m.allowed_token_ids(), backend
        m = compiled.new_matcher()
        rejected = not drive(m, tokenizer, bad) or m.vocab.stop_ids[0] not in m.allowed_token_ids()
        assert rejected, (backend, schema, bad)


def test_make_grammar_backend_rejects_unknown_name(tokenizer):
    with pytest.raises(ValueError, match="grammar_backend must be one of"):
        make_grammar_backend("llguidance", tokenizer, VOCAB_SIZE)


def test_padded_vocab_ids_are_never_allowed(tokenizer):
    backend = make_grammar_backend("xgrammar", tokenizer, VOCAB_SIZE + 64)
    m = backend.compile(constraint_from_params(regex=r"[a-z ]+")).new_matcher()
    assert max(m.allowed_token_ids()) < VOCAB_SIZE
    assert not m.accept_token(VOCAB_SIZE + 3)
