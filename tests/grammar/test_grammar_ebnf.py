"""Regex → EBNF and Lark → EBNF translation (runtime/grammar/regex_ebnf.py, lark_ebnf.py),
checked against Python's ``re`` and the ``lark`` parser; no tokenizer needed."""

from __future__ import annotations

import functools
import re

import lark
import pytest
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlang.runtime.grammar.lark_ebnf import lark_to_ebnf
from agentlang.runtime.grammar.regex_ebnf import ebnf_string, regex_to_ebnf


class Acceptor:
    """Full-string acceptance of an EBNF grammar, through xgrammar's public matcher API."""

    def __init__(self, ebnf: str):
        info = xgr.TokenizerInfo(["a"])  # the vocabulary is irrelevant for accept_string
        self.compiled = xgr.GrammarCompiler(info, cache_enabled=False).compile_grammar(ebnf)

    def __call__(self, text: str) -> bool:
        m = xgr.GrammarMatcher(self.compiled, terminate_without_stop_token=True)
        return m.accept_string(text) and m.is_completed()


@functools.lru_cache(maxsize=None)
def regex_acceptor(pattern: str) -> Acceptor:
    return Acceptor(f"root ::= {regex_to_ebnf(pattern)}\n")


REGEXES = [
    r"[a-c]+x?", r"(ab|cd){2,3}", r"\d{1,3}(\.\d+)?", r"[^ab\n]c", r"(?i:ab)c", r"a.b",
    r"(?s:a.b)", r"\w+\s\W", r"[\d_-]+", r"a{0}b", r"(a|)b", r"x*?y+?", r"\D\S", r"[A-Z]{2,}",
    r"(?i)[a-c]x", r'"[^"\\]*"', r"[.*+?]\.", r"é[à-ü]+", r"[\Da]\w", r"(?a:\w\W)", r"[^\s]",
]
UNICODE_EXTRAS = "éüàßö٣\u2003\x1c"  # non-ASCII letters, an Arabic-Indic digit, Unicode spaces
ALPHABET = "abcdxyABCXY019 _-.\n\"\\*+?" + UNICODE_EXTRAS
GEN_ALPHABET = "".join(chr(c) for c in range(0x20, 0x7F)) + "\n\t" + UNICODE_EXTRAS


@pytest.mark.parametrize("pattern", REGEXES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_regex_translation_matches_python(pattern, data):
    accept = regex_acceptor(pattern)
    good = data.draw(st.from_regex(pattern, fullmatch=True, alphabet=GEN_ALPHABET))
    assert accept(good), (pattern, good)
    anything = data.draw(st.text(ALPHABET, max_size=8))
    assert accept(anything) == bool(re.fullmatch(pattern, anything)), (pattern, anything)


@pytest.mark.parametrize("pattern, what", [
    (r"^ab", "anchor"), (r"ab$", "anchor"), (r"a\bb", "anchor"), (r"(?=a)a", "lookahead"),
    (r"(?<!a)b", "lookbehind"), (r"(a)\1", "back-reference"), (r"(a)?(?(1)b|c)", "back-reference"),
    (r"(?>ab)", "construct"), (r"a*+", "possessive"),
])
def test_untranslatable_regex_raises(pattern, what):
    with pytest.raises(ValueError, match=what):
        regex_to_ebnf(pattern)


def test_ebnf_string_escapes_round_trip():
    text = 'q"\\\n\t\x00é😀]-^['
    assert Acceptor(f"root ::= {ebnf_string(text)}\n")(text)


CALC = r"""
?start: sum
?sum: product
    | sum "+" product   -> add
    | sum "-" product   -> sub
?product: atom
    | product "*" atom  -> mul
    | product "/" atom  -> div
?atom: NUMBER           -> number
     | "-" atom         -> neg
     | "(" sum ")"
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""

JSON_LARK = r"""
?start: value
?value: object | array | string | SIGNED_NUMBER -> number
      | "true" -> true | "false" -> false | "null" -> null
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""


@functools.lru_cache(maxsize=None)
def lark_parser(grammar: str) -> lark.Lark:
    return lark.Lark(grammar)


@functools.lru_cache(maxsize=None)
def lark_acceptor(grammar: str) -> Acceptor:
    return Acceptor(lark_to_ebnf(grammar))


def lark_accepts(grammar: str, text: str) -> bool:
    try:
        lark_parser(grammar).parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


@pytest.mark.parametrize("grammar, texts", [
    (CALC, ["1+2", "(1.5 * 3) - -4", "12e3/4", "1 +", "1++2", "1 ", "((2)", "2*(3+4)/5", "x",
            "1\t*\t2", ".5+6."]),
    (JSON_LARK, ['{"a": [1, 2.5, "x\\"y"], "b": null}', '{"a": "x"y"}', "[]", '{"a":1,}',
                 '[true,false,null]', '{"k" : {"n":[ ]}}', '"unterminated', '[-1e5]']),
])
def test_lark_translation_agrees_with_lark(grammar, texts):
    accept = Acceptor(lark_to_ebnf(grammar))
    for text in texts:
        assert accept(text) == lark_accepts(grammar, text), text


def test_lark_leading_ignored_text_is_not_generated():
    # Lark skips leading %ignore text; we never generate it (a subset, still parseable).
    accept = Acceptor(lark_to_ebnf(CALC))
    assert lark_accepts(CALC, " 1") and not accept(" 1")


def expressions():
    number = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,2})?", fullmatch=True)
    return st.recursive(
        number,
        lambda sub: st.one_of(
            st.tuples(sub, st.sampled_from(["+", "-", "*", "/", " + ", " * "]), sub).map("".join),
            sub.map(lambda e: f"({e})"),
            sub.map(lambda e: f"-{e}"),
        ),
        max_leaves=6,
    )


@settings(max_examples=60, deadline=None)
@given(expr=expressions())
def test_lark_arithmetic_expressions_accepted(expr):
    assert lark_accepts(CALC, expr)
    assert lark_acceptor(CALC)(expr), expr


def test_lark_templates_flags_ranges():
    grammar = 'start: _sep{item, ","}\n_sep{x, sep}: x (sep x)*\nitem: "a"i | /b+/ | "c"~2..3\n'
    accept = Acceptor(lark_to_ebnf(grammar))
    for text in ["A,bbb,cc,a", "A,c", "ccc", "cccc", "a,,a"]:
        assert accept(text) == lark_accepts(grammar, text), text


@pytest.mark.parametrize("grammar, reason", [
    ("start: A\nA: /(?<=x)y/\n", "terminal A: lookahead/lookbehind"),
    ("start: A\nA: /^y/\n", "terminal A: an anchor"),
    ("start: A\n%declare A\n", "terminal A has no pattern"),
    ('start: "a" (\n', "line 1 column"),
])
def test_lark_errors_name_the_grammar(grammar, reason):
    with pytest.raises(ValueError) as info:
        lark_to_ebnf(grammar)
    assert str(info.value).startswith("grammar:") and reason in str(info.value)
