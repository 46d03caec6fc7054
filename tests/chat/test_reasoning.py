"""Reasoning blocks split from answers (``runtime/chat/reasoning.py``): streamed in any chunking
the split equals the whole text's; the grammar of a constraint after a block
(``runtime/grammar/tool_format.py``) accepts the block then a valid answer, or the answer
alone, and nothing else."""

import random

import pytest

from agentlang.runtime.chat.reasoning import ReasoningSplit
from agentlang.runtime.grammar.base import make_grammar_backend
from agentlang.runtime.grammar.constraints import constraint_from_params

CASES = [
    ("<think>\nLet me think.\n</think>\n\nThe answer is 4.", ("Let me think.", "The answer is 4.")),
    ('  <think>abc</think>\n\n{"a": 1}', ("abc", '{"a": 1}')),
    ("Plain answer", (None, "Plain answer")),
    ("<think>\ncut in the middle \n", ("cut in the middle", "")),
    ("<thi", (None, "<thi")),
    ("", (None, "")),
    ("<think>\n\n</think>\n\nhi </think> there", ("", "hi </think> there")),
    ("<think>a</thin", ("a</thin", "")),
    ("answer <think>not a block</think>", (None, "answer <think>not a block</think>")),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_split_whole_and_streamed_in_any_chunks(text, expected):
    assert ReasoningSplit("think").split(text) == expected
    for seed in range(8):
        rng, split, thought, answer, i = random.Random(seed), ReasoningSplit("think"), "", "", 0
        while i < len(text):
            n = rng.randint(1, 5)
            t, a = split.feed(text[i:i + n])
            thought, answer, i = thought + t, answer + a, i + n
        t, a = split.flush()
        assert (thought + t, answer + a) == (expected[0] or "", expected[1])


def test_no_reasoning_passes_everything_through():
    assert ReasoningSplit(None).split("<think>x</think>y") == (None, "<think>x</think>y")


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [{"name": "add", "parameters": SCHEMA}]


@pytest.fixture(scope="module")
def backend(tokenizer):
    return make_grammar_backend("xgrammar", tokenizer, 49152)


def accepts(backend, tokenizer, constraint, text: str) -> bool:
    m = backend.compile(constraint).new_matcher()
    return all(m.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("fields,good,bad", [
    ({"json_schema": SCHEMA}, ['<think>\nhmm {not json}\n</think>\n\n{"a":3}', '{"a":3}'],
     ['<think>x</think>\n\n{"b":3}', "prose"]),
    ({"tool_calls": {"tools": TOOLS, "format": "hermes", "forced": False}},
     ['<think>\nI could <tool_call> it\n</think>\n\nok <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
      "just text"],
     ['<think>x</think>\n\n<tool_call>\n{"name": "sub"']),
])
def test_constraint_after_a_reasoning_block(backend, tokenizer, fields, good, bad):
    c = constraint_from_params(reasoning="think", **fields)
    assert c.reasoning == "think"
    for text in good:
        assert accepts(backend, tokenizer, c, text), text
    for text in bad:
        assert not accepts(backend, tokenizer, c, text), text


def test_reasoning_needs_a_constraint_it_can_follow():
    with pytest.raises(ValueError, match="reasoning: only applies together with json_schema or tool_calls"):
        constraint_from_params(regex="a+", reasoning="think")
    with pytest.raises(ValueError, match="reasoning: unknown block 'ponder'; accepted: think"):
        constraint_from_params(json_schema=SCHEMA, reasoning="ponder")
