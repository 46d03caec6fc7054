"""FunctionGemma's argument syntax (``runtime/grammar/gemma_args.py``): the grammar built from a
schema accepts exactly the arguments the schema allows (checked against ``jsonschema`` on
random values and on hand-made breakages), the parser reads back what the writer wrote, strings
may hold anything but the ``<escape>`` delimiter, and keywords the grammar cannot enforce are
refused by name."""

import json
import random

import jsonschema
import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string as accepts

from agentlang.runtime.grammar.gemma_args import (GemmaArgsError, args_grammar, parse_value,
                                                  write_value)
from agentlang.runtime.grammar.tool_format import FORMATS

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    "opts": {"type": "object", "properties": {"x": {"type": "boolean"}, "r": {"type": "number"}}},
    "any": {}}, "required": ["city", "days"]}


@pytest.fixture(scope="module")
def grammar():
    return xgr.Grammar.from_ebnf(args_grammar(SCHEMA))


def random_args(rng: random.Random) -> dict:
    text = "".join(rng.choice("ab <e>{},:'\"scape<") for _ in range(rng.randrange(8)))
    args = {"city": text, "days": rng.randint(1, 7)}
    if rng.random() < 0.5:
        args["unit"] = rng.choice("cf")
    if rng.random() < 0.5:
        args["tags"] = [rng.choice(["x", "", "<y"]) for _ in range(rng.randrange(3))]
    if rng.random() < 0.5:
        args["opts"] = {k: v for k, v in (("x", rng.random() < .5), ("r", -1.5e3)) if rng.random() < .7}
    if rng.random() < 0.3:
        args["any"] = rng.choice([None, 3, "t", [1, {"k": [True]}], {}])
    order = list(SCHEMA["properties"])
    return {k: args[k] for k in order if k in args}          # the schema's order


def test_written_arguments_are_accepted_and_read_back(grammar):
    rng = random.Random(5)
    for _ in range(200):
        args = random_args(rng)
        if "<escape>" in args["city"]:
            continue
        text = write_value(args)
        jsonschema.validate(args, SCHEMA)
        assert accepts(grammar, text), text
        assert parse_value(text) == args


@pytest.mark.parametrize("text", [
    "{}", "{days:3}",                                                  # required ones missing
    "{city:<escape>a<escape>,city:<escape>b<escape>,days:3}",          # twice
    "{days:3,city:<escape>a<escape>}",                                 # out of order
    "{city:<escape>a<escape>,days:8}", "{city:<escape>a<escape>,days:0}",
    "{city:<escape>a<escape>,days:2,unit:<escape>k<escape>}",
    "{city:<escape>a<escape>,days:2,tags:[<escape>1<escape>,<escape>2<escape>,<escape>3<escape>]}",
    "{city:<escape>a<escape>,days:2,zzz:1}", "{city:3,days:2}",
    "{city:<escape>a<escape>b<escape>,days:2}", "{city:<escape>a<escape>, days:2}",
    '{city:"a",days:2}', "{city:<escape>a<escape>,days:2,opts:{x:1}}",
])
def test_arguments_the_schema_refuses_are_not_accepted(grammar, text):
    assert not accepts(grammar, text)


def test_the_parser_reads_nested_values_and_names_what_is_wrong():
    assert parse_value("{a:[1,2.5,true,null,<escape>x, y<escape>],b:{c:{}}}") == \
        {"a": [1, 2.5, True, None, "x, y"], "b": {"c": {}}}
    for bad in ("{a:<escape>x}", "{a:1", "{a}", "{a:1}x", "[1;2]"):
        with pytest.raises(GemmaArgsError):
            parse_value(bad)


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "object", "properties": {"s": {"type": "string", "pattern": "a+"}}}, "pattern"),
    ({"type": "object", "properties": {"s": {"type": "string", "minLength": 2}}}, "minLength"),
    ({"type": "object", "properties": {"n": {"type": "number", "minimum": 0}}}, "minimum"),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}, "minimum"),
])
def test_keywords_the_grammar_cannot_enforce_are_refused_by_name(schema, keyword):
    with pytest.raises(ValueError, match=keyword):
        FORMATS["functiongemma"].content(schema)


def test_the_format_round_trips_a_call_with_text_around():
    from agentlang.runtime.grammar.tool_format import parse_calls

    args = {"city": "Buenos Aires, {AR}", "days": 7}
    text = f"Sure.<start_function_call>call:get_weather{write_value(args)}<end_function_call>"
    assert parse_calls("functiongemma", text) == ([("get_weather", args)], "Sure.")
    assert parse_calls("functiongemma", text[:-5]) is None            # the call is not closed
    assert json.loads(json.dumps(args)) == args


def test_strings_never_hold_the_formats_markers():
    """A string holding ``<end_function_call>`` would end the call at the parser: the format's
    grammar keeps its markers out of strings (and the delimiter, and the response turn)."""
    fmt = FORMATS["functiongemma"]
    g = xgr.Grammar.from_ebnf(fmt.content({"type": "object", "properties": {"s": {"type": "string"}}})
                              ["grammar"])
    for marker in ("<end_function_call>", "<start_function_call>", "<start_function_response>"):
        assert not accepts(g, f"{{s:<escape>a{marker}b<escape>}}"), marker
        assert accepts(g, f"{{s:<escape>a{marker[:-1]}b<escape>}}"), marker      # a prefix is fine
    assert accepts(g, "{s:<escape><<end_function_cal<<escape>}")


@pytest.mark.slow
def test_a_call_completes_within_the_budget(tmp_path, model_path):
    """The budget guard closes a rambling string argument in time (its completion search
    tries the ``<escape>`` delimiter as one step): at each budget the call parses and
    validates (off: the same prompt runs past the budget inside the string)."""
    from agentlang.runtime import Engine, SamplingParams
    from agentlang.runtime.grammar.tool_format import parse_calls
    from tests.support.families import family_model

    eng = Engine(str(family_model(model_path, tmp_path / "fg", "functiongemma")),
                 kv_budget_mb=32)
    answer = {"type": "object", "properties": {"answer": {"type": "string"}},
              "required": ["answer"]}
    spec = {"tools": [{"name": "final_answer", "parameters": answer}],
            "format": "functiongemma", "forced": True}
    for budget, guard in ((30, True), (64, True), (30, False)):
        out = eng.generate("Write a long story about a dragon. ", SamplingParams(
            max_tokens=budget, temperature=0, tool_calls=spec, complete_within_budget=guard))
        parsed = parse_calls("functiongemma", out.text)
        if guard:
            assert parsed is not None, out.text
            (name, args), = parsed[0]
            jsonschema.validate(args, answer)
        else:
            assert parsed is None and out.outputs[0].finish_reason == "length", out.text
