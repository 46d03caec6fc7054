"""Lark grammars: validation with the ``lark`` package and translation to xgrammar EBNF.

The grammar is loaded by ``lark`` itself, so the accepted dialect is exactly Lark's (rules,
``|``, ``?``/``*``/``+``/``~n..m``, ``[...]``, parentheses, literals with flags, regex terminals,
terminals built from terminals, ``%import common.X``, ``%ignore``, templates, aliases, inlined
``?rule``/``_rule``, ``%override``/``%extend``). Lark compiles it to plain BNF rules plus one regex
(or literal) per terminal; that compiled form is what we translate, so no construct can be
dropped on the way: every rule and terminal is emitted, and anything the translation cannot
express (a terminal regex with lookaround/anchors/back-references, a ``%declare``d terminal
without a pattern) raises ``ValueError``.

Semantics: the result is the context-free language of the grammar with each terminal matched by
its regex, and the ``%ignore`` terminals allowed after every terminal (not before the first one,
so output never starts with ignored text). Lark's lexer additionally resolves terminal
collisions by priority and longest match; for grammars whose adjacent terminals can run together
(``NAME NAME`` with no separator) an output can be a CFG derivation that Lark tokenizes
differently. Terminal and rule priorities are not part of the language and are ignored.
"""

from __future__ import annotations

import re

from agentlang.runtime.grammar.regex_ebnf import ebnf_string, regex_to_ebnf

_IGNORE_RULE = "lark_ignore"
# Lark's common.ESCAPED_STRING uses a lookbehind; as a token (the lexer takes the shortest match
# of its lazy body) it is exactly a quoted string without unescaped quotes or newlines.
_ESCAPED_STRING_EBNF = r'("\"" ([^"\\\n] | "\\" [^\n])* "\"")'


def load_lark(grammar: str):
    """Parse ``grammar`` with ``lark`` (Earley, start rule ``start``); returns the ``Lark`` object.

    Raises ``ValueError('grammar: ...')`` with line and column for syntax errors.
    """
    import lark

    try:
        return lark.Lark(grammar, start="start")
    except lark.exceptions.UnexpectedInput as e:  # errors that carry a position
        raise ValueError(
            f"grammar: Lark syntax error at line {e.line}, column {e.column}: {e}"
        ) from None
    except lark.exceptions.LarkError as e:
        msg = str(e).strip()
        if " at line " not in msg:
            msg += _locate_name(grammar, msg)
        raise ValueError(f"grammar: invalid Lark grammar: {msg}") from None
    except Exception as e:  # a terminal regex that does not compile (re/regex error)
        raise ValueError(f"grammar: invalid Lark grammar: {type(e).__name__}: {e}") from None


def _locate_name(grammar: str, msg: str) -> str:
    """' (line L, column C)' of the first whole-word use of the first quoted name in ``msg``."""
    m = re.search(r"'([A-Za-z_][A-Za-z0-9_]*)'", msg)
    if not m:
        return ""
    use = re.search(rf"(?<![A-Za-z0-9_]){m.group(1)}(?![A-Za-z0-9_])", grammar)
    if not use:
        return ""
    line = grammar.count("\n", 0, use.start()) + 1
    column = use.start() - (grammar.rfind("\n", 0, use.start()) + 1) + 1
    return f" (line {line}, column {column})"


def lark_to_ebnf(grammar: str) -> str:
    """Translate a Lark grammar into xgrammar EBNF with root rule ``root``.

    Raises ``ValueError('grammar: ...')`` for syntax errors and untranslatable constructs.
    """
    import lark

    parser = load_lark(grammar)
    escaped_string = _escaped_string_regex()
    terminals = {t.name: t for t in parser.terminals}
    rules: dict[str, list[list]] = {}
    for rule in parser.rules:
        rules.setdefault(rule.origin.name, []).append(rule.expansion)

    lines = ["root ::= " + _rule_name("start")]
    used_terminals: set[str] = set()
    for name, expansions in rules.items():
        alts = []
        for expansion in expansions:
            syms = []
            for sym in expansion:
                if isinstance(sym, lark.grammar.Terminal):
                    used_terminals.add(sym.name)
                    syms.append(_term_name(sym.name))
                else:
                    syms.append(_rule_name(sym.name))
            alts.append(" ".join(syms) if syms else '""')
        lines.append(f"{_rule_name(name)} ::= " + " | ".join(f"({a})" for a in alts))

    ignore = list(parser.ignore_tokens)
    suffix = f" {_IGNORE_RULE}" if ignore else ""
    for name in sorted(used_terminals | set(ignore)):
        if name not in terminals:
            raise ValueError(f"grammar: terminal {name} has no pattern (%declare is not supported)")
        body = _terminal_ebnf(terminals[name], escaped_string)
        lines.append(f"{_body_name(name)} ::= {body}")
        if name in used_terminals:
            lines.append(f"{_term_name(name)} ::= {_body_name(name)}{suffix}")
    if ignore:
        alts = " | ".join(_body_name(n) for n in ignore)
        lines.append(f"{_IGNORE_RULE} ::= ({alts})*")
    return "\n".join(lines) + "\n"


def _ident(prefix: str, name: str) -> str:
    """An EBNF identifier for a Lark name; template instances like ``_sep{item,COMMA}`` contain
    characters EBNF names cannot, which are spelled as ``_xHH_`` (injective, so no collisions)."""
    safe = re.sub(r"[^A-Za-z0-9_]", lambda m: f"_x{ord(m.group()):X}_", name.replace("_x", "_x_"))
    return prefix + safe


def _rule_name(name: str) -> str:
    return _ident("r_", name)


def _term_name(name: str) -> str:
    return _ident("t_", name)


def _body_name(name: str) -> str:
    return _ident("tb_", name)


def _terminal_ebnf(term, escaped_string: str) -> str:
    pattern = term.pattern
    if pattern.type == "str" and not pattern.flags:
        return ebnf_string(pattern.value)
    regex = pattern.to_regexp()
    if regex == escaped_string:
        return _ESCAPED_STRING_EBNF
    try:
        return regex_to_ebnf(regex)
    except ValueError as e:
        raise ValueError(f"grammar: terminal {term.name}: {e}") from None


def _escaped_string_regex() -> str:
    import lark

    probe = lark.Lark("start: ESCAPED_STRING\n%import common.ESCAPED_STRING\n")
    return next(t.pattern.to_regexp() for t in probe.terminals if t.name == "ESCAPED_STRING")
