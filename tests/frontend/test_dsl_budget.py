"""The DSL inherits budget-aware completion (issue 16): on the embedded model through the
in-process engine, at temperatures 1.0–1.5 and budgets a few tokens above the minimum, every
``gen(json_schema=…)`` / ``gen(regex=…)`` / typed ``gen`` value parses and validates, a JSON
gen's ``state[name]`` parses, ``gen(choices=…)`` is one of the choices, and ``@al.tool`` calls
and ``agent_loop`` steps are always valid calls."""

import json
import re

import jsonschema
import pytest

import agentlang as al
from agentlang.agent import call_schema, final_schema
from data.dsl_tools import multiply, to_fahrenheit
from agentlang.runtime import SamplingParams
from agentlang.runtime.grammar.budget import BudgetTooSmall

pytestmark = pytest.mark.slow

ORDER = {"type": "object",
         "properties": {"item": {"type": "string"}, "qty": {"type": "integer"},
                        "notes": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
         "required": ["item", "qty", "notes"]}
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
SIZES = ["small", "medium", "large"]
TOPICS = ["a hardware order", "a bakery order", "a garden order", "a library loan"]


@pytest.fixture(scope="module")
def runtime():
    backend = al.Runtime(kv_budget_mb=256)
    yield backend
    backend.close()


def minimum(runtime, **constraint) -> int:
    with pytest.raises(BudgetTooSmall) as e:
        runtime.engine.generate("x", SamplingParams(max_tokens=1, **constraint))
    return e.value.minimum


TOOLS = {"multiply": multiply, "to_fahrenheit": to_fahrenheit}


@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_constrained_gens_are_valid_at_tight_budgets(runtime, temperature):
    order_budget = minimum(runtime, json_schema=ORDER) + 4
    phone_budget = minimum(runtime, regex=PHONE)

    @al.function
    def intake(s, topic):
        s += al.user("Describe " + topic + " at great length as JSON, with many notes.")
        s += al.assistant(al.gen("order", json_schema=ORDER, max_tokens=order_budget))
        s += al.user("Your phone number, with many extra digits?")
        s += al.assistant(al.gen("phone", regex=PHONE, max_tokens=phone_budget))
        s += al.user("How many, and what fraction?")
        s += al.assistant(al.gen_int("count", max_tokens=1) + " and " +
                          al.gen("ratio", dtype=float, max_tokens=2))
        s += al.user("True or False: the order is urgent?")
        s += al.assistant(al.gen("urgent", dtype=bool, max_tokens=2))
        s += al.user("A nickname, quoted?") + al.assistant(al.gen_string("nick", max_tokens=2))
        s += al.user("Pick a size.")
        s += al.assistant(al.gen("size", choices=SIZES, temperature=temperature))

    states = intake.run_batch([{"topic": t} for t in TOPICS], backend=runtime,
                              temperature=temperature, seed=16)
    for st in states:
        jsonschema.validate(json.loads(st["order"]), ORDER)
        assert re.fullmatch(PHONE, st["phone"]), st["phone"]
        assert isinstance(st["count"], int) and isinstance(st["ratio"], float)
        assert isinstance(st["urgent"], bool) and isinstance(st["nick"], str)
        assert st["size"] in SIZES
    forced = sum(st.get_meta_info(n)["forced_completion_tokens"] for st in states
                 for n in ("order", "phone", "count", "ratio", "urgent", "nick"))
    assert forced > 0, "the guard never had to act: the budgets are not tight"


@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_tool_calls_and_agent_loop_are_valid_at_tight_budgets(runtime, temperature):
    tools = (multiply, to_fahrenheit)
    call_budget = minimum(runtime, json_schema=call_schema(tools)) + 3
    answer = {"type": "integer"}
    loop_budget = max(minimum(runtime, json_schema=call_schema(tools, answer, allow_final=True)),
                      minimum(runtime, json_schema=final_schema(answer))) + 3

    @al.function
    def pipeline(s, request):
        s += al.system(al.tools_prompt(list(tools), final_answer=False))
        s += al.user(request)
        s += al.assistant(al.tool_call(list(tools), name="result", max_tokens=call_budget,
                                       temperature=temperature))
        s += al.system(al.tools_prompt(list(tools)))
        s += al.user("Now solve it step by step with the tools: " + request)
        s += al.agent_loop(list(tools), name="answer", max_steps=3, answer_schema=answer,
                           max_tokens=loop_budget, temperature=temperature)

    requests = ["What is 123456 times 654321?", "Convert 36.6 Celsius to Fahrenheit."]
    states = pipeline.run_batch([{"request": r} for r in requests], backend=runtime, seed=7)
    for st in states:
        meta = st.get_meta_info("result")
        jsonschema.validate(meta["arguments"], TOOLS[meta["tool"]].parameters)
        assert json.loads(meta["call_text"]) == {"name": meta["tool"],
                                                 "arguments": meta["arguments"]}
        for step in st.get_meta_info("answer")["steps"]:
            jsonschema.validate(step["arguments"], TOOLS[step["tool"]].parameters)
        assert st["answer"] is None or isinstance(st["answer"], int)
