"""Tool calling: generate a call under the tools' JSON schema, run it, feed the result back.

A call is generated as ``{"name": <tool>, "arguments": {...}}`` under a JSON schema built
from the tools' parameter schemas, so the arguments always parse and validate. When the
backend knows the model's family format (``Backend.tool_format``: the in-process runtime
reads it from the chat template), the call is written that way: the format's text around the
object is filled in (Hermes ``<tool_call>\n`` … ``\n</tool_call>``, Mistral ``[TOOL_CALLS][`` …
``]``) and Llama 3's key is ``"parameters"``; the object itself stays schema-constrained.
FunctionGemma's calls (``call:NAME{k:<escape>v<escape>}``, not JSON) are generated whole under
the runtime's ``tool_calls`` constraint in that format and parsed with its parser. The agent
loop alternates an assistant turn (one call) with a ``result_role`` turn holding the result,
until the model calls ``final_answer`` or ``max_steps`` is reached (the last step may only
answer). Both run on a stream's worker thread (see interpreter.py). Before a tool runs the
backend hears how long it is expected to take (:func:`run_tool`: a next-use hint).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agentlang.ir import AgentLoop, ToolCall
from agentlang.sampling import make_options
from agentlang.stream import Stream

if TYPE_CHECKING:
    from agentlang.tools import Tool

FINAL = "final_answer"


def _call_option(name: str, parameters: dict, key: str = "arguments") -> dict:
    return {"type": "object",
            "properties": {"name": {"enum": [name]}, key: parameters},
            "required": ["name", key], "additionalProperties": False}


def _final_parameters(answer_schema: Any) -> dict:
    answer = answer_schema if answer_schema is not None else {"type": "string"}
    return {"type": "object", "properties": {"answer": answer}, "required": ["answer"],
            "additionalProperties": False}


def final_schema(answer_schema: Any, key: str = "arguments") -> dict:
    return _call_option(FINAL, _final_parameters(answer_schema), key)


def call_schema(tools: tuple[Tool, ...], answer_schema: Any = None, allow_final: bool = False,
                key: str = "arguments") -> dict:
    """JSON schema of one call to any of ``tools`` (or the final answer, if allowed);
    ``key``: the arguments' key of the call format."""
    options = [_call_option(t.name, t.parameters, key) for t in tools]
    if allow_final:
        options.append(final_schema(answer_schema, key))
    return options[0] if len(options) == 1 else {"anyOf": options}


def call_format(exe: Stream) -> tuple[str, str | None, str]:
    """``(text before the call object, its arguments key, text after it)`` for the backend's
    model (module doc); key None: FunctionGemma's syntax, not a JSON object (``_gemma_call``)."""
    fmt = exe.ctx.backend.tool_format()
    if fmt is None:
        return "", "arguments", ""
    from agentlang.runtime.grammar.tool_format import FORMATS

    f = FORMATS[fmt]
    if f.gemma:         # FunctionGemma's call:NAME{k:v} is not a JSON object: key None
        return f.head, None, f.tail
    return f.head, f.args_key, f.tail


def tools_prompt(tools: list[Tool] | tuple[Tool, ...], final_answer: bool = True) -> str:
    """A system-prompt paragraph describing the tools and the call format."""
    lines = ['You can call tools. To call one, reply with only a JSON object '
             '{"name": <tool name>, "arguments": {<arguments>}}.']
    if final_answer:
        lines.append('When you know the answer, reply {"name": "final_answer", '
                     '"arguments": {"answer": <answer>}}.')
    lines.append("Tools:")
    for t in tools:
        lines.append(f"- {t.name}: {t.description} Parameters: {json.dumps(t.parameters)}")
    return "\n".join(lines)


def render_result(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def parse_call(text: str, tools: tuple[Tool, ...], key: str = "arguments") -> tuple[str, dict]:
    """(tool name, arguments) from generated call text; ValueError if it is not a call."""
    try:
        call = json.loads(text)
        name, arguments = call["name"], call[key]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"the model's tool call is not a complete JSON call (raise max_tokens "
                         f"if it was cut off): {text!r}") from None
    if name != FINAL and name not in {t.name for t in tools}:
        raise ValueError(f"the model called unknown tool {name!r}")
    return name, arguments


def _generate_call(exe: Stream, schema: dict, max_tokens: int,
                   temperature: float | None, head: str = "", tail: str = "") -> tuple[str, Any]:
    """The call object under ``schema``, written between the format's ``head`` and ``tail``."""
    if head:
        exe.fill(head)
    opts = exe.resolve(make_options(max_tokens=max_tokens, temperature=temperature,
                                    json_schema=schema))
    text, result = exe.generate_text(opts)
    if tail:
        exe.fill(tail)
    return text, result


def _gemma_call(exe: Stream, tools: list[dict], max_tokens: int,
                temperature: float | None) -> tuple[str, dict, str, Any]:
    """(name, arguments, text, result) of one call in FunctionGemma's format to one of
    ``tools`` ([{name, parameters}]), constrained by its grammar (runtime/grammar/gemma_args)."""
    from agentlang.runtime.grammar.tool_format import parse_calls

    opts = replace(make_options(max_tokens=max_tokens, temperature=temperature),
                   tool_calls={"tools": tools, "format": "functiongemma", "forced": True})
    text, result = exe.generate_text(exe.resolve(opts))
    parsed = parse_calls("functiongemma", text)
    if parsed is None or len(parsed[0]) != 1:
        raise ValueError(f"the model's tool call is not a complete call (raise max_tokens if "
                         f"it was cut off): {text!r}")
    (name, arguments), = parsed[0]
    return name, arguments, text, result


def _tool_specs(tools, answer_schema: Any = None, final: bool = False,
                only_final: bool = False) -> list[dict]:
    specs = [] if only_final else [{"name": t.name, "parameters": t.parameters} for t in tools]
    if final or only_final:
        specs.append({"name": FINAL, "parameters": _final_parameters(answer_schema)})
    return specs


def run_tool(exe: Stream, tool: Tool, arguments: dict) -> Any:
    """Run ``tool``, first telling the backend when this run will generate again (the tool's
    expected duration: ``Backend.next_use``), so a server keeping the run's KV while the tool
    runs releases first the runs expected back last."""
    expected = tool.expected_duration()
    if expected is not None:
        exe.ctx.backend.next_use(exe.ctx.run_id, expected)
    return tool.invoke(arguments)


def execute_tool_call(exe: Stream, node: ToolCall) -> None:
    head, key, tail = call_format(exe)
    if key is None:
        name, arguments, text, result = _gemma_call(exe, _tool_specs(node.tools),
                                                    node.max_tokens, node.temperature)
    else:
        text, result = _generate_call(exe, call_schema(node.tools, key=key), node.max_tokens,
                                      node.temperature, head, tail)
        name, arguments = parse_call(text, node.tools, key)
    tool = next(t for t in node.tools if t.name == name)
    value = run_tool(exe, tool, arguments)
    exe.store_var(node.name, value, {**result.meta, "tool": name, "arguments": arguments,
                                     "call_text": text, "result": value})


def execute_agent_loop(exe: Stream, node: AgentLoop) -> None:
    steps: list[dict] = []
    answer: Any = None
    head, key, tail = call_format(exe)
    for step in range(node.max_steps):
        last = step == node.max_steps - 1
        exe.begin_role("assistant")
        if key is None:             # FunctionGemma's syntax
            name, arguments, _, _ = _gemma_call(
                exe, _tool_specs(node.tools, node.answer_schema, True, last), node.max_tokens,
                node.temperature)
            exe.end_role("assistant")
        else:
            schema = final_schema(node.answer_schema, key) if last else call_schema(
                node.tools, node.answer_schema, allow_final=True, key=key)
            text, _ = _generate_call(exe, schema, node.max_tokens, node.temperature, head, tail)
            exe.end_role("assistant")
            name, arguments = parse_call(text, node.tools, key)
        if name == FINAL:
            answer = arguments["answer"]
            break
        tool = next(t for t in node.tools if t.name == name)
        try:
            value, error = run_tool(exe, tool, arguments), None
        except Exception as e:  # noqa: BLE001 - the model sees the error and may retry
            value, error = None, f"{type(e).__name__}: {e}"
        steps.append({"tool": name, "arguments": arguments, "result": value, "error": error})
        exe.begin_role(node.result_role)
        exe.fill(node.result_prefix + (f"error: {error}" if error else render_result(value)))
        exe.end_role(node.result_role)
    exe.store_var(node.name, answer, {"steps": steps})
