"""Translate a Python regular expression into an xgrammar EBNF expression (full-match language).

Used for the regex terminals of Lark grammars. The pattern is parsed with Python's own regex
parser (``re._parser``), so the syntax is exactly Python's. Supported: literals, ``.``, character
classes (ranges, negation, ``\\d \\w \\s``), alternation, groups, greedy/lazy/possessive
repetition with any bounds, and the flags ``i`` (ASCII/single-char case folding), ``s``, ``x``,
``a``, ``u``. Anchors, lookaround, back-references, conditionals and atomic groups change the
matched language in ways a context-free grammar cannot express here, and raise ``ValueError``.
``\\d \\w \\s`` and their negations are exact: Python's Unicode sets (computed by scanning all
code points with ``re``, ~0.2 s, once per translation that uses them) or ASCII under ``(?a)``.
"""

from __future__ import annotations

import re

try:
    from re import _parser as sre  # Python >= 3.11
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as sre  # type: ignore[no-redef]

_MAX_CODEPOINT = 0x10FFFF
_ASCII_RANGES = {
    sre.CATEGORY_DIGIT: [(0x30, 0x39)],
    sre.CATEGORY_WORD: [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    sre.CATEGORY_SPACE: [(0x09, 0x0D), (0x20, 0x20)],
}
_CATEGORY_REGEX = {sre.CATEGORY_DIGIT: r"\d+", sre.CATEGORY_WORD: r"\w+", sre.CATEGORY_SPACE: r"\s+"}
_NEGATED_CATEGORY = {
    sre.CATEGORY_NOT_DIGIT: sre.CATEGORY_DIGIT,
    sre.CATEGORY_NOT_WORD: sre.CATEGORY_WORD,
    sre.CATEGORY_NOT_SPACE: sre.CATEGORY_SPACE,
}


def ebnf_char(cp: int, in_class: bool = False) -> str:
    """One code point escaped for an xgrammar EBNF string literal or character class."""
    ch = chr(cp)
    if ch in '"\\' or (in_class and ch in "[]-^"):
        return "\\" + ch
    if 0x20 <= cp < 0x7F:
        return ch
    return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"


def ebnf_string(text: str) -> str:
    """``text`` as an xgrammar EBNF string literal (``""`` for the empty string)."""
    return '"' + "".join(ebnf_char(ord(c)) for c in text) + '"'


def regex_to_ebnf(pattern: str, flags: int = 0) -> str:
    """An EBNF expression whose language is the strings ``re.fullmatch(pattern, s, flags)`` accepts.

    Raises ``ValueError`` (without a field prefix; callers add context) for unsupported syntax.
    """
    try:
        parsed = sre.parse(pattern, flags)
    except re.error as e:
        raise ValueError(f"invalid regular expression at position {e.pos}: {e.msg}") from None
    return _Converter(pattern).seq(parsed, parsed.state.flags)


class _Converter:
    def __init__(self, pattern: str):
        self.pattern = pattern
        self._unicode: dict[int, list[tuple[int, int]]] = {}  # category -> ranges (memo)

    def category(self, cat, flags: int) -> list[tuple[int, int]]:
        """Exact code-point ranges of a class escape (``\\d``, ``\\W``, ...) under ``flags``."""
        positive = _NEGATED_CATEGORY.get(cat, cat)
        if positive not in _CATEGORY_REGEX:
            raise self.fail(f"character category {cat}")
        if flags & re.ASCII:
            ranges = _ASCII_RANGES[positive]
        else:
            if positive not in self._unicode:
                self._unicode[positive] = _unicode_ranges(_CATEGORY_REGEX[positive])
            ranges = self._unicode[positive]
        return ranges if positive == cat else _complement(ranges)

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{what} is not supported in /{self.pattern}/")

    def seq(self, items, flags: int) -> str:
        parts: list[str] = []
        literal: list[int] = []  # run of plain literals, merged into one string

        def flush() -> None:
            if literal:
                parts.append(ebnf_string("".join(map(chr, literal))))
                literal.clear()

        for op, av in items:
            if op is sre.LITERAL and not (flags & re.IGNORECASE and _has_case(av)):
                literal.append(av)
                continue
            flush()
            parts.append(self.item(op, av, flags))
        flush()
        if not parts:
            return '""'
        return parts[0] if len(parts) == 1 else "(" + " ".join(parts) + ")"

    def item(self, op, av, flags: int) -> str:
        if op is sre.LITERAL:
            return _char_class(_fold([(av, av)], flags), negate=False)
        if op is sre.NOT_LITERAL:
            return _char_class(_fold([(av, av)], flags), negate=True)
        if op is sre.ANY:
            if flags & re.DOTALL:
                return _char_class([(0, _MAX_CODEPOINT)], negate=False)
            return _char_class([(0x0A, 0x0A)], negate=True)
        if op is sre.IN:
            ranges, negate = self.class_items(av, flags)
            return _char_class(_fold(ranges, flags), negate)
        if op is sre.BRANCH:
            return "(" + " | ".join(self.seq(alt, flags) for alt in av[1]) + ")"
        if op is sre.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            return self.seq(sub, (flags | add_flags) & ~del_flags)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) or op is getattr(sre, "POSSESSIVE_REPEAT", None):
            if op is getattr(sre, "POSSESSIVE_REPEAT", None):
                raise self.fail("a possessive repeat")
            lo, hi, sub = av
            return _repeat("(" + self.seq(sub, flags) + ")", lo, hi)
        if op is sre.AT:
            raise self.fail("an anchor (^, $, \\b, \\A, \\Z)")
        if op in (sre.ASSERT, sre.ASSERT_NOT):
            raise self.fail("lookahead/lookbehind")
        if op in (sre.GROUPREF, sre.GROUPREF_EXISTS):
            raise self.fail("a back-reference")
        raise self.fail(f"regex construct {op}")

    def class_items(self, items, flags: int) -> tuple[list[tuple[int, int]], bool]:
        ranges: list[tuple[int, int]] = []
        negate = False
        for op, av in items:
            if op is sre.NEGATE:
                negate = True
            elif op is sre.LITERAL:
                ranges.append((av, av))
            elif op is sre.RANGE:
                ranges.append(av)
            elif op is sre.CATEGORY:
                ranges.extend(self.category(av, flags))
            else:
                raise self.fail(f"character-class item {op} {av}")
        return ranges, negate


def _unicode_ranges(regex: str) -> list[tuple[int, int]]:
    """Code-point ranges of the characters ``regex`` (a one-category run, e.g. ``\\w+``) matches."""
    gap_lo, gap_hi = 0xD800, 0xE000  # surrogates: not characters, skipped
    text = "".join(map(chr, range(gap_lo))) + "".join(map(chr, range(gap_hi, _MAX_CODEPOINT + 1)))
    out = []
    for m in re.finditer(regex, text):
        lo, hi = m.start(), m.end() - 1
        lo, hi = (lo if lo < gap_lo else lo + gap_hi - gap_lo), (hi if hi < gap_lo else hi + gap_hi - gap_lo)
        out.append((lo, hi))
    return out


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, nxt = [], 0
    for lo, hi in sorted(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= _MAX_CODEPOINT:
        out.append((nxt, _MAX_CODEPOINT))
    return out


def _has_case(cp: int) -> bool:
    c = chr(cp)
    return c.lower() != c.upper()


def _fold(ranges: list[tuple[int, int]], flags: int) -> list[tuple[int, int]]:
    """Add the other-case counterparts of the characters in ``ranges`` under ``re.IGNORECASE``."""
    if not flags & re.IGNORECASE:
        return ranges
    out = list(ranges)
    for lo, hi in ranges:
        if hi - lo > 0x3000:  # huge ranges: fold only the ASCII letters they contain
            lo, hi = max(lo, 0x41), min(hi, 0x7A)
        for cp in range(lo, hi + 1):
            for other in {chr(cp).lower(), chr(cp).upper()}:
                if len(other) == 1 and ord(other) != cp:
                    out.append((ord(other), ord(other)))
    return out


def _char_class(ranges: list[tuple[int, int]], negate: bool) -> str:
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    if not merged:  # [] matches nothing; [^] matches any character
        if negate:
            merged, negate = [[0, _MAX_CODEPOINT]], False
        else:
            raise ValueError("an empty character class matches nothing")
    body = "".join(
        ebnf_char(lo, True) if lo == hi else f"{ebnf_char(lo, True)}-{ebnf_char(hi, True)}"
        for lo, hi in merged
    )
    return f"[{'^' if negate else ''}{body}]"


def _repeat(expr: str, lo: int, hi: int) -> str:
    unbounded = hi == sre.MAXREPEAT
    if (lo, unbounded) == (0, True):
        return expr + "*"
    if (lo, unbounded) == (1, True):
        return expr + "+"
    if (lo, hi) == (0, 1):
        return expr + "?"
    if unbounded:
        return f"{expr}{{{lo},}}"
    if hi == 0:
        return '""'
    return f"{expr}{{{lo},{hi}}}"
