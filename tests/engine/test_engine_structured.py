"""Structured generation through the engine: the 20-schema set on both grammar backends,
regex / choices / Lark / pydantic / typed values, exact jump-forward, and bad constraints."""

import json
import re

import jsonschema
import lark
import pytest
from pydantic import BaseModel

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.core.errors import ErrorCode
from data.schemas import KEY_HEAVY, OUTLINES_UNSUPPORTED, SCHEMAS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["xgrammar", "outlines"])
def eng(request, model_path):
    return Engine(model_path, page_size=16, kv_budget_mb=128, grammar_backend=request.param)


def chat(text):
    return [{"role": "user", "content": text}]


def test_schema_set_all_valid(eng):
    backend = eng.config.grammar_backend
    cases = [(n, s) for n, s, _ in SCHEMAS
             if not (backend == "outlines" and n in OUTLINES_UNSUPPORTED)]
    assert len(cases) >= (20 if backend == "xgrammar" else 17)
    outs = eng.generate([chat(f"Give an example JSON value for '{n}'.") for n, _ in cases],
                        [SamplingParams(max_tokens=160, temperature=0, json_schema=s)
                         for _, s in cases])
    for (name, schema), out in zip(cases, outs):
        assert out.finish_reason == "stop", f"{name}: did not finish: {out.text!r}"
        jsonschema.validate(json.loads(out.text), schema)
    if backend == "outlines":   # unsupported features are errors, never silently dropped
        for name, schema, _ in SCHEMAS:
            if name in OUTLINES_UNSUPPORTED:
                out = eng.generate("x", SamplingParams(max_tokens=4, json_schema=schema))
                assert out.finish_reason == "abort" and out.error.field == "json_schema"
                assert out.error.code == ErrorCode.INVALID_CONSTRAINT, out.error


@pytest.mark.parametrize("regex, prompt", [
    (r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)", "The server's IPv4 address is "),
    (r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", "The date in ISO format is "),
    (r"\(\d{3}\) \d{3}-\d{4}", "Call us at "),
])
def test_regex_matches_fully(eng, regex, prompt):
    out = eng.generate(prompt, SamplingParams(max_tokens=24, temperature=0, regex=regex))
    assert re.fullmatch(regex, out.text), out.text


def test_choices_and_typed_values(eng):
    out = eng.generate(chat("Is the sky green? Answer yes or no."),
                       SamplingParams(max_tokens=8, temperature=0, choices=["yes", "no", "maybe"]))
    assert out.text in ("yes", "no", "maybe")
    n = eng.generate("The number of legs of a spider is ",
                     SamplingParams(max_tokens=6, temperature=0, value_type="int"))
    int(n.text)
    b = eng.generate("True or false: water is wet. Answer: ",
                     SamplingParams(max_tokens=4, temperature=0, value_type="bool"))
    assert b.text in ("true", "false", "True", "False")


def test_lark_grammar_output_parses(eng):
    if eng.config.grammar_backend == "outlines":
        with pytest.raises(ValueError, match="grammar"):
            out = eng.generate("1+", SamplingParams(max_tokens=4, grammar='start: "a"'))
            raise ValueError(out.error)
        return
    grammar = r"""
    ?start: expr
    ?expr: term (("+" | "-") term)*
    ?term: factor (("*" | "/") factor)*
    ?factor: NUMBER | "(" expr ")"
    %import common.NUMBER
    """
    out = eng.generate("An arithmetic expression: ",
                       SamplingParams(max_tokens=16, temperature=0, grammar=grammar))
    lark.Lark(grammar, start="start").parse(out.text)


def test_pydantic_model(eng):
    class City(BaseModel):
        name: str
        country: str
        is_capital: bool

    out = eng.generate(chat("Describe Paris as JSON."),
                       SamplingParams(max_tokens=64, temperature=0, json_schema=City))
    City.model_validate_json(out.text)


def test_jump_forward_same_text_fewer_passes(eng):
    prompt = chat("Invent a person and describe them as JSON.")

    def run(jf):
        before = eng.metrics()["forward_passes"]
        out = eng.generate(prompt, SamplingParams(max_tokens=120, temperature=0,
                                                  json_schema=KEY_HEAVY, jump_forward=jf))
        return out, eng.metrics()["forward_passes"] - before

    off, passes_off = run(False)
    on, passes_on = run(True)
    assert on.text == off.text and on.token_ids == off.token_ids
    jsonschema.validate(json.loads(on.text), KEY_HEAVY)
    assert passes_on < passes_off and on.meta["forward_passes_saved"] > 0
    print(f"jump-forward: {passes_off} -> {passes_on} forward passes")


@pytest.mark.parametrize("kw, field", [
    (dict(json_schema={"type": "nonsense"}), "json_schema"),
    (dict(regex="[a-"), "regex"),
    (dict(grammar='start: ("a" '), "grammar"),
    (dict(choices=[]), "choices"),
    (dict(value_type="complex"), "value_type"),
    (dict(regex="a+", choices=["a"]), "regex|choices"),
])
def test_bad_constraints_rejected_at_submission(eng, kw, field):
    with pytest.raises(ValueError, match=field):
        eng.generate("x", SamplingParams(max_tokens=4, **kw))
    after = eng.generate("Still here?", SamplingParams(max_tokens=2, temperature=0))
    assert after.error is None and after.finish_reason in ("stop", "length")


def test_jump_forward_to_the_end_of_the_grammar(eng):
    """A draft that completes the grammar is kept whole (regression: the output used to stop
    after the first drafted token because the matcher already looked terminated)."""
    schema = {"enum": ["Paris-Lyon", "Rome-Milan", "Berlin-Munich"]}
    prompt = chat("Which route goes from Paris to Lyon? Reply as JSON.")
    on, off = (eng.generate(prompt, SamplingParams(max_tokens=32, temperature=0,
                                                   json_schema=schema, jump_forward=jf))
               for jf in (True, False))
    assert on.text == off.text and json.loads(on.text) in schema["enum"]


@pytest.mark.parametrize("kw", [{"choices": [""]}, {"regex": "ab"}])
def test_min_tokens_gives_way_to_a_complete_constraint(eng, kw):
    """min_tokens holds the end back only while the constraint admits more text: a complete
    match that admits nothing more ends the output (found by schemathesis: min_tokens=1 with
    choices [""] used to leave no allowed token and fail the request)."""
    out = eng.generate("Say: ", SamplingParams(max_tokens=8, min_tokens=6, temperature=0, **kw))
    assert out.error is None and out.finish_reason == "stop", (out.error, out.text)
    assert out.text == ("" if "choices" in kw else "ab")
