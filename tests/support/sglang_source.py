"""SGLang 0.5.23's protocol field lists and defaults, read from the installed ``sglang`` wheel's
source (parsed, not imported: its server modules need GPU-only packages). The oracle the
native-protocol tests compare agentlang against."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

INTERNAL_SAMPLING = {"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
                     "is_normalized", "ebnf_full_assistant"}


def _root() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def installed() -> bool:
    return _root() is not None


def _parse(source: str, tries: int = 3) -> ast.Module:
    """``ast.parse``, tried again on CPython 3.11's spurious ``SystemError: AST constructor
    recursion depth mismatch``: the AST builder's depth counter is shared module state, so a
    parse that runs inside another one's construction (Python code run by the garbage collector,
    another thread) upsets it (python/cpython#106905). Seen once in a full ``make test``; the
    same source parses on the next try."""
    for attempt in range(tries):
        try:
            return ast.parse(source)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def class_fields(rel: str, cls: str) -> dict[str, Any]:
    """Annotated fields of ``cls`` in ``sglang/<rel>``: name → literal default (``...`` when
    there is none or it is not a literal)."""
    tree = _parse((_root() / rel).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    out: dict[str, Any] = {}
    for n in node.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            try:
                out[n.target.id] = ... if n.value is None else ast.literal_eval(n.value)
            except ValueError:
                out[n.target.id] = ...
    return out


def generate_fields() -> set[str]:
    """``GenerateReqInput``'s fields: the top-level keys of ``/generate``."""
    return set(class_fields("srt/managers/io_struct.py", "GenerateReqInput"))


def sampling_fields() -> dict[str, Any]:
    """The API fields of ``SamplingParams`` (internal ones dropped) with their defaults."""
    fields = class_fields("srt/sampling/sampling_params.py", "SamplingParams")
    return {k: v for k, v in fields.items() if k not in INTERNAL_SAMPLING}
