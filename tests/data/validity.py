"""The validity oracle for constrained outputs: ``jsonschema`` (with format checks), ``re``
full match, or the ``lark`` parser, by the constraint field a request used."""

from __future__ import annotations

import json
import re


def is_valid(constraint: dict, text: str, formats: bool = True) -> bool:
    """``constraint``: one of ``{"json_schema": s}``, ``{"regex": r}``, ``{"grammar": g}``.
    ``formats=False`` skips ``format`` checks (the backends' date regexes allow e.g.
    2024-11-31: calendar validity is not enforced by any grammar)."""
    import jsonschema
    import lark

    if "json_schema" in constraint:
        schema = constraint["json_schema"]
        try:  # strict=False: xgrammar lets raw control characters into JSON strings
            value = json.loads(text, strict=False)
        except json.JSONDecodeError:
            return False
        v = jsonschema.validators.validator_for(schema)
        return v(schema, format_checker=v.FORMAT_CHECKER if formats else None).is_valid(value)
    if "regex" in constraint:
        return re.fullmatch(constraint["regex"], text) is not None
    try:
        lark.Lark(constraint["grammar"]).parse(text)
        return True
    except lark.exceptions.LarkError:
        return False
