"""Tool-call formats (``runtime/grammar/tool_format.py``): what each family's constraint accepts
is what its parser reads back — auto mode (free text, every started call valid) and forced
(exactly one call) — and the parser's reading of each format."""

import pytest

from agentlang.runtime.grammar.base import make_grammar_backend
from agentlang.runtime.grammar.constraints import constraint_from_params
from agentlang.runtime.grammar.tool_format import FORMATS, parse_calls

ADD = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}},
                                     "required": ["a"]}}
CALL = {"agentlang": '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
        "hermes": '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
        "mistral": '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}]',
        "llama3_json": '{"name": "add", "parameters": {"a": 1}}',
        "functiongemma": "<start_function_call>call:add{a:1}<end_function_call>"}
BROKEN = {"agentlang": '<tool_call>{"name": "sub"', "hermes": '<tool_call>\n{"name": "add", "arguments": {"b"',
          "mistral": '[TOOL_CALLS][{"name": "add", "arguments": 3', "llama3_json": '{"name": "ad"',
          "functiongemma": "<start_function_call>call:add{b:"}


@pytest.fixture(scope="module")
def backend(tokenizer):
    return make_grammar_backend("xgrammar", tokenizer, 49152)


def accepts(backend, tokenizer, c, text) -> bool:
    m = backend.compile(c).new_matcher()
    return all(m.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_auto_and_forced_constraints_accept_the_format_and_nothing_broken(backend, tokenizer, fmt):
    auto = constraint_from_params(tool_calls={"tools": [ADD], "format": fmt, "forced": False})
    forced = constraint_from_params(tool_calls={"tools": [ADD], "format": fmt, "forced": True})
    assert accepts(backend, tokenizer, auto, "Sure. " + CALL[fmt])
    assert not accepts(backend, tokenizer, auto, "Sure. " + BROKEN[fmt])
    assert accepts(backend, tokenizer, forced, CALL[fmt])
    assert not accepts(backend, tokenizer, forced, "Sure. " + CALL[fmt])     # nothing but the call
    text = CALL[fmt] if fmt == "llama3_json" else "Sure. " + CALL[fmt]    # llama3: the whole reply
    assert parse_calls(fmt, text) == ([("add", {"a": 1})], None if fmt == "llama3_json" else "Sure.")


def test_parse_reads_several_calls_and_refuses_broken_ones():
    two = '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]'
    assert parse_calls("mistral", two) == ([("a", {}), ("b", {"x": 1})], None)
    assert parse_calls("hermes", CALL["hermes"] + "\n" + CALL["hermes"])[0] == [("add", {"a": 1})] * 2
    assert parse_calls("mistral", "[TOOL_CALLS][{") is None
    nested = 'I will: {"type": "function", "function": {"name": "add", "parameters": {"a": 1}}}'
    assert parse_calls("llama3_json", nested) == ([("add", {"a": 1})], 'I will: {"type": "function", "function": }')
    assert parse_calls("hermes", "no call here") is None
    fenced = "```json\n" + '{"name": "add", "arguments": {"a": 1}}' + "\n```"
    assert parse_calls("hermes", fenced) == ([("add", {"a": 1})], None)


def test_unknown_format_and_keys_are_named():
    with pytest.raises(ValueError, match="tool_calls.format: unknown format 'xml'; accepted: agentlang, hermes"):
        constraint_from_params(tool_calls={"tools": [ADD], "format": "xml"})
    with pytest.raises(ValueError, match=r"tool_calls: unknown keys \['strict'\]"):
        constraint_from_params(tool_calls={"tools": [ADD], "strict": True})
    legacy = constraint_from_params(tool_calls=[ADD])
    assert legacy == constraint_from_params(tool_calls={"tools": [ADD]})     # one spec
    assert legacy.call_format() == ("agentlang", False)
