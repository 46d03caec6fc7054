"""@agentlang.tool schemas, tool_call and agent_loop on the Mock backend."""

import enum
import json
from typing import Any, Literal, Optional

import jsonschema
import pydantic
import pytest

import agentlang as al
from agentlang.agent import call_schema


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


class Point(pydantic.BaseModel):
    x: float
    y: float


@al.tool
def convert(value: float, unit: Unit, precision: int = 2, note: Optional[str] = None) -> str:
    """Convert a temperature.

    Args:
        value: the temperature to convert
        unit: the unit to convert to
        precision: digits after the point
    """
    return f"{value}{unit}"


def test_schema_from_hints_and_docstring():
    assert isinstance(convert, al.Tool) and convert.name == "convert"
    assert convert.description == "Convert a temperature."
    p = convert.parameters
    assert p["required"] == ["value", "unit"] and p["additionalProperties"] is False
    assert p["properties"]["value"] == {"type": "number",
                                        "description": "the temperature to convert"}
    assert p["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert p["properties"]["precision"] == {"type": "integer", "default": 2,
                                            "description": "digits after the point"}
    assert p["properties"]["note"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
    assert convert.schema["type"] == "function"
    assert convert.schema["function"]["parameters"] is p
    jsonschema.Draft202012Validator.check_schema(p)


def test_container_literal_pydantic_and_rest_docstring():
    @al.tool(name="plot", description="Plot points.")
    def plot_points(points: list[Point], style: Literal["dots", "line"],
                    labels: dict[str, int], pair: tuple[int, str], tags: list[str] | None = None):
        """Ignored because description= is given.

        :param points: the points
        """

    p = plot_points.parameters["properties"]
    assert plot_points.name == "plot" and plot_points.description == "Plot points."
    assert p["points"]["type"] == "array" and p["points"]["items"]["properties"]["x"]
    assert p["points"]["description"] == "the points"
    assert p["style"]["enum"] == ["dots", "line"]
    assert p["labels"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert p["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    plot_points.validate({"points": [{"x": 1, "y": 2}], "style": "dots", "labels": {"a": 1},
                          "pair": [1, "a"]})
    with pytest.raises(ValueError, match="do not match its schema"):
        plot_points.validate({"points": [], "style": "bars", "labels": {}, "pair": [1, "a"]})


@pytest.mark.parametrize("make, match", [
    (lambda: al.tool(lambda x: x), "parameter 'x' has no type hint"),
    (lambda: al.tool(lambda *a: a), r"\*args/\*\*kwargs"),
    (lambda: al.tool(lambda **kw: kw), r"\*args/\*\*kwargs"),
    (lambda: al.tool(42), "needs a function"),
])
def test_unschemable_tools_fail_at_decoration(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_unschemable_type_hints_name_the_parameter():
    with pytest.raises(ValueError, match="parameter 'blob'.*Any cannot form a JSON schema"):
        @al.tool
        def f(ok: int, blob: Any) -> None: ...

    class Custom:
        pass

    with pytest.raises(ValueError, match="parameter 'c'.*Custom cannot form a JSON schema"):
        @al.tool
        def g(c: Custom) -> None: ...

    with pytest.raises(ValueError, match="parameter 'd'.*dict needs str keys"):
        @al.tool
        def h(d: dict[int, str]) -> None: ...

    with pytest.raises(ValueError, match="parameter 'xs'.*list needs an item type"):
        @al.tool
        def k(xs: list) -> None: ...


@al.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@al.tool
def lookup(city: str) -> dict:
    """Population of a city."""
    return {"paris": {"population": 2100000}}.get(city.lower(), {"error": "unknown city"})


@al.tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


def test_tool_call_generates_valid_arguments_and_runs_the_tool():
    @al.function
    def prog(s):
        s += al.system(al.tools_prompt([add, lookup]))
        s += al.user("What is 2 + 40?")
        s += al.assistant(al.tool_call([add, lookup], name="result"))
        s += al.user("Result: " + al.gen("echo", max_tokens=1))

    m = al.Mock({"<|im_start|>assistant\n": '{"name": "add", "arguments": {"a": 2, "b": 40}}'})
    st = prog.run(backend=m)
    assert st["result"] == 42
    meta = st.get_meta_info("result")
    assert meta["tool"] == "add" and meta["arguments"] == {"a": 2, "b": 40}
    assert '{"name": "add", "arguments": {"a": 2, "b": 40}}' in st.text()
    schema = [c.options for c in m.calls if c.kind == "generate"][0].json_schema
    assert schema == call_schema((add, lookup))
    assert '"name": <tool name>' in st.text() and "add: Add two integers." in st.text()


def test_tool_call_arguments_always_validate_against_schema():
    @al.function
    def prog(s, i):
        s += "Call " + i + ": " + al.tool_call(convert, name="r")

    for i in range(10):   # Mock samples arguments from the schema when nothing is scripted
        st = prog.run(i=str(i), backend=al.Mock())
        args = st.get_meta_info("r")["arguments"]
        jsonschema.validate(args, convert.parameters)
        assert st["r"] == convert(**args)


def test_agent_loop_feeds_results_back_until_final_answer():
    script = iter([
        '{"name": "lookup", "arguments": {"city": "Paris"}}',
        '{"name": "divide", "arguments": {"a": 1, "b": 0}}',   # the tool raises → fed back
        '{"name": "final_answer", "arguments": {"answer": "2.1 million"}}',
    ])
    prompts = []

    def reply(prompt):
        prompts.append(prompt)
        return next(script)

    @al.function
    def agent(s, question):
        s += al.system(al.tools_prompt([divide, lookup]))
        s += al.user(question)
        s += al.agent_loop([divide, lookup], name="answer", max_steps=5)

    st = agent.run(question="Population of Paris?", backend=al.Mock(reply))
    assert st["answer"] == "2.1 million"
    steps = st.get_meta_info("answer")["steps"]
    assert [x["tool"] for x in steps] == ["lookup", "divide"]
    assert steps[0]["result"] == {"population": 2100000} and steps[0]["error"] is None
    assert steps[1]["error"] == "ZeroDivisionError: division by zero"
    roles = [m["role"] for m in st.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert st.messages()[3]["content"] == 'Tool result: {"population": 2100000}'
    assert st.messages()[5]["content"] == "Tool result: error: ZeroDivisionError: division by zero"
    assert 'Tool result: {"population": 2100000}' in prompts[1]


def test_agent_loop_forces_an_answer_at_max_steps():
    @al.function
    def agent(s):
        s += al.user("go")
        s += al.agent_loop(add, name="out", max_steps=2,
                           answer_schema={"type": "integer"})

    m = al.Mock(lambda p: '{"name": "add", "arguments": {"a": 1, "b": 2}}')
    st = agent.run(backend=m)
    assert isinstance(st["out"], int)
    schemas = [c.options.json_schema for c in m.calls if c.kind == "generate"]
    assert "anyOf" in schemas[0]
    assert schemas[1]["properties"]["name"] == {"enum": ["final_answer"]}
    assert len(st.get_meta_info("out")["steps"]) == 1


def test_tool_call_bad_arguments():
    with pytest.raises(ValueError, match="decorated with @agentlang.tool"):
        al.tool_call([lambda x: x])
    with pytest.raises(ValueError, match="unique"):
        al.tool_call([add, add])
    with pytest.raises(ValueError, match="max_steps"):
        al.agent_loop(add, max_steps=0)

    @al.function
    def in_role(s):
        with s.assistant():
            s += al.agent_loop(add)

    with pytest.raises(ValueError, match="agent_loop opens its own roles"):
        in_role.run(backend=al.Mock())


def test_cut_off_tool_call_is_a_clear_error():
    @al.function
    def prog(s):
        s += al.tool_call(add, name="r", max_tokens=5)

    with pytest.raises(ValueError, match="not a complete JSON call"):
        prog.run(backend=al.Mock())
    json.dumps(add.parameters)


@pytest.mark.slow
@pytest.mark.parametrize("template,head,key", [
    ("hermes_think", '<tool_call>\n{"name":"add","arguments":', "arguments"),    # compact JSON
    ("mistral", '[TOOL_CALLS][{"name":"add","arguments":', "arguments"),
    ("llama3_json", '{"name":"add","parameters":', "parameters"),
    ("functiongemma", "<start_function_call>call:add{", None),       # not JSON: its syntax
])
def test_calls_are_written_in_the_models_family_format(tmp_path, model_path, template, head, key):
    """The in-process runtime on a model whose template has its own call format: tool_call and
    agent_loop write calls that way (the object still schema-constrained: always valid)."""
    from tests.support.families import family_model

    backend = al.Runtime(str(family_model(model_path, tmp_path / template, template)),
                         kv_budget_mb=32)
    try:
        assert backend.tool_format() == {"hermes_think": "hermes"}.get(template, template)

        @al.function
        def prog(s):
            s += al.user("What is 2 + 40?")
            s += al.assistant(al.tool_call(add, name="result", max_tokens=40, temperature=0))

        st = prog.run(backend=backend)
        assert head in st.text(), st.text()
        assert st["result"] == add(**st.get_meta_info("result")["arguments"])

        @al.function
        def agent(s):
            s += al.user("Add 2 and 40, then answer.")
            s += al.agent_loop([add], name="answer", max_steps=2, max_tokens=48, temperature=0)

        st = agent.run(backend=backend)
        assert (f'"{key}":' if key else "<start_function_call>call:") in st.text()
        assert st.get_meta_info("answer")["steps"] is not None
    finally:
        backend.shutdown()
