"""Function tools of the chat endpoint: validation, prompting, enforcement and parsing.

Each model family writes calls its own way (:mod:`agentlang.runtime.grammar.tool_format`,
chosen from its chat template by :class:`~agentlang.runtime.chat.family.ChatFamily`): a family
whose template renders tools (Qwen's Hermes ``<tool_call>``, Mistral's ``[TOOL_CALLS]``, Llama
3's JSON) gets them through its template and its calls are constrained and parsed in its
format; other models get agentlang's own prompt and format (below).

``tool_choice``:
- ``"none"``: tools are ignored.
- ``"auto"`` (default when tools are given): the tools are described in the system prompt and a
  call is parsed out of the model's text (``<tool_call>{...}</tool_call>`` blocks or a bare JSON
  object with ``name`` and ``arguments``); text that is not a valid call is plain content. On
  the xgrammar backend (and when no other constraint is given) the output is constrained by
  the ``tool_calls`` constraint: free text, but once the model writes ``<tool_call>`` the rest
  of the call follows the tools' schemas, so a started call is always a valid call.
- ``"required"`` / ``{"type": "function", "function": {"name": N}}``: the output is constrained
  by a JSON schema ``{"name": const, "arguments": <the tool's parameters>}`` (``anyOf`` over the
  tools for ``required``), so the arguments always parse and validate; in a family's format,
  to exactly one call written that way.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from agentlang.runtime.grammar.tool_format import parse_calls
from agentlang.runtime.server.errors import APIError, bad_request
from agentlang.runtime.server.protocol import TOOL_NAME_PATTERN, Tool

NAME_RE = re.compile(TOOL_NAME_PATTERN)
EMPTY_PARAMS = {"type": "object", "properties": {}}

TOOL_PROMPT = (
    "You can call functions. To call one, reply with only a JSON object inside tags:\n"
    '<tool_call>{{"name": <function-name>, "arguments": <arguments-object>}}</tool_call>\n'
    "Otherwise answer normally. Available functions:\n<tools>\n{tools}\n</tools>"
)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str | None
    parameters: dict

    def as_json(self) -> str:
        d: dict[str, Any] = {"name": self.name}
        if self.description:
            d["description"] = self.description
        d["parameters"] = self.parameters
        return json.dumps(d, ensure_ascii=False)


@dataclass(frozen=True)
class ToolPlan:
    """What the request's tools mean for generation: ``mode`` is none/auto/required/named."""

    mode: str
    tools: tuple[ToolSpec, ...]
    forced: str | None = None                # the named function (mode "named")
    format: str = "agentlang"                # grammar.tool_format.FORMATS: how calls are written

    @property
    def active(self) -> bool:
        return self.mode != "none" and bool(self.tools)

    @property
    def enforced(self) -> bool:
        return self.mode in ("required", "named")

    def system_prompt(self) -> str:
        return TOOL_PROMPT.format(tools="\n".join(t.as_json() for t in self.tools))

    def constraint_schema(self) -> dict:
        """The JSON schema a forced call must satisfy (name first, then arguments)."""
        def one(t: ToolSpec) -> dict:
            return {"type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"]}
        chosen = [t for t in self.tools if self.mode != "named" or t.name == self.forced]
        return one(chosen[0]) if len(chosen) == 1 else {"anyOf": [one(t) for t in chosen]}

    def call_tools(self) -> list[dict]:
        """The tools as the ``tool_calls`` constraint takes them (``tool_choice="auto"``)."""
        return [{"name": t.name, "parameters": t.parameters} for t in self.tools]

    def constraint(self) -> dict:
        """The SamplingParams constraint field of this plan: calls in its format, free text
        around them (auto) or exactly one call (required / named); agentlang's forced call is
        the JSON object of :meth:`constraint_schema`."""
        if self.enforced and self.format == "agentlang":
            return {"json_schema": self.constraint_schema()}
        tools = [t for t in self.call_tools() if self.mode != "named" or t["name"] == self.forced]
        return {"tool_calls": {"tools": tools, "format": self.format, "forced": self.enforced}}

    def template_tools(self) -> list[dict]:
        """The tools as chat templates take them (OpenAI's ``tools`` items)."""
        return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                  "parameters": t.parameters}} for t in self.tools]

    def parse(self, text: str) -> tuple[list[dict], str | None] | None:
        """``(tool_calls, remaining content or None)`` found in ``text`` (in this plan's format),
        or ``None`` when it is not a valid call of one of the tools (then it is plain content)."""
        found = parse_calls(self.format, text)
        if found is None:
            return None
        calls = []
        for name, args in found[0]:
            spec = next((t for t in self.tools if t.name == name), None)
            if spec is None or not _valid(args, spec.parameters):
                return None
            calls.append(tool_call(name, args))
        return (calls, found[1]) if calls else None


def tool_call(name: str, args: dict) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def _valid(args: dict, schema: dict) -> bool:
    import jsonschema

    return jsonschema.validators.validator_for(schema)(schema).is_valid(args)


def plan_tools(tools: list[Tool] | None, tool_choice: Any, fmt: str = "agentlang") -> ToolPlan:
    """Validate ``tools`` and ``tool_choice`` (calls written in format ``fmt``); raises a 400
    :class:`APIError` naming the field."""
    if tools is not None and not tools:
        raise bad_request("tools: must be a non-empty list when given", "tools")
    specs = tuple(_check_tool(i, t) for i, t in enumerate(tools or []))
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise bad_request(f"tools: duplicate function name(s) {sorted(dup)}", "tools")
    if tool_choice is None:
        return ToolPlan("auto" if specs else "none", specs, format=fmt)
    if not specs and tool_choice != "none":
        raise bad_request("tool_choice: only allowed when tools are given", "tool_choice")
    if tool_choice in ("none", "auto", "required"):
        return ToolPlan(tool_choice, specs, format=fmt)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if name not in names:
            raise bad_request(f"tool_choice.function.name: {name!r} is not one of the tools "
                              f"{names}", "tool_choice")
        return ToolPlan("named", specs, name, fmt)
    raise bad_request('tool_choice: must be "none", "auto", "required" or '
                      '{"type": "function", "function": {"name": ...}}, '
                      f"got {tool_choice!r}", "tool_choice")


def _check_tool(i: int, tool: Tool) -> ToolSpec:
    where = f"tools[{i}]"
    if tool.type != "function":
        raise bad_request(f'{where}.type: must be "function", got {tool.type!r}', f"{where}.type")
    f = tool.function
    if not NAME_RE.match(f.name):
        raise bad_request(f"{where}.function.name: must match {NAME_RE.pattern} "
                          f"(letters, digits, _ and -, at most 64), got {f.name!r}",
                          f"{where}.function.name")
    params = f.parameters if f.parameters is not None else EMPTY_PARAMS
    import jsonschema

    try:
        jsonschema.validators.validator_for(params).check_schema(params)
    except jsonschema.SchemaError as e:
        at = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise APIError(400, f"{where}.function.parameters: invalid JSON schema at {at}: "
                       f"{e.message}", f"{where}.function.parameters", "invalid_schema") from None
    if params.get("type", "object") != "object":
        raise bad_request(f"{where}.function.parameters: must describe an object "
                          f'("type": "object"), got type {params.get("type")!r}',
                          f"{where}.function.parameters")
    return ToolSpec(f.name, f.description, params)
