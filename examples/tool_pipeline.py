"""Tool pipeline: three local Python tools, each call's arguments generated under its schema.

`@al.tool` turns a typed function into a tool with a JSON schema (from its type hints and
docstring). `al.tool_call(tool)` makes the model write `{"name": ..., "arguments": {...}}`
constrained to that schema, runs the tool and stores its return value; the program feeds
each result back as a user turn, and the final answer is JSON validated by a pydantic model.

    python examples/tool_pipeline.py [--url URL] [--max-tokens N]
"""

import argparse
import json
from typing import Literal

import jsonschema
from pydantic import BaseModel

import agentlang as al

DISTANCES_KM = {"Paris-Lyon": 392, "Rome-Milan": 477, "Berlin-Munich": 504}
METRES = {"kilometres": 1000.0, "miles": 1609.344, "metres": 1.0, "feet": 0.3048}


@al.tool
def distance_km(route: Literal[tuple(DISTANCES_KM)]) -> int:
    """Road distance of a route in kilometres, from a local table."""
    return DISTANCES_KM[route]


@al.tool
def calculator(a: float, op: Literal["+", "-", "*", "/"], b: float) -> float:
    """Compute `a op b`."""
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]


@al.tool
def convert(value: float, from_unit: Literal[tuple(METRES)],
            to_unit: Literal[tuple(METRES)]) -> float:
    """Convert a length from one unit to another."""
    return round(value * METRES[from_unit] / METRES[to_unit], 2)


PIPELINE = [distance_km, calculator, convert]


class Answer(BaseModel):
    miles: float


@al.function
def trip(s, question, max_tokens):
    s += al.system(al.tools_prompt(PIPELINE, final_answer=False))
    # One worked example shows the small model how the steps chain.
    s += al.user("How far is it from Rome to Milan and back, in miles?")
    s += al.assistant('{"name": "distance_km", "arguments": {"route": "Rome-Milan"}}')
    s += al.user("Tool result: 477")
    s += al.assistant('{"name": "calculator", "arguments": {"a": 477, "op": "*", "b": 2}}')
    s += al.user("Tool result: 954")
    s += al.assistant('{"name": "convert", "arguments": '
                      '{"value": 954, "from_unit": "kilometres", "to_unit": "miles"}}')
    s += al.user("Tool result: 592.79")
    s += al.assistant('{"miles": 592.79}')

    s += al.user(question)
    for i, tool in enumerate(PIPELINE):
        s += al.assistant(al.tool_call(tool, name=f"step{i}", max_tokens=max_tokens))
        s += al.user("Tool result: " + json.dumps(s[f"step{i}"]))
    s += al.assistant(al.gen("answer", json_schema=Answer, max_tokens=max_tokens))


def main(backend, max_tokens=64):
    state = trip.run(question="How far is it from Paris to Lyon and back, in miles?",
                     max_tokens=max_tokens, backend=backend, temperature=0)
    calls = [state.get_meta_info(f"step{i}") for i in range(len(PIPELINE))]
    for tool, call in zip(PIPELINE, calls):
        assert call["tool"] == tool.name
        jsonschema.validate(call["arguments"], tool.parameters)  # schema-valid arguments
        assert call["result"] == tool(**call["arguments"])
    # Each result was fed back: the next call consumed it, and the answer reports the last one.
    assert calls[1]["arguments"]["a"] == calls[0]["result"]
    assert calls[2]["arguments"]["value"] == calls[1]["result"]
    answer = Answer.model_validate_json(state["answer"])
    assert answer.miles == calls[2]["result"], (answer, calls)
    return answer, calls


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="agentlang server URL (default: in-process runtime)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    with (al.RuntimeEndpoint(args.url) if args.url else al.Runtime()) as backend:
        answer, calls = main(backend, max_tokens=args.max_tokens)
        for call in calls:
            print(f"{call['tool']}({call['arguments']}) -> {call['result']}")
        print(answer)
