"""How a model family writes a tool call, in one table: the marker that starts a call in free
text, the text around each call, and the key of its arguments — used to constrain calls
(:func:`structural_tag`, compiled by the xgrammar backend) and to parse them
(:func:`parse_calls`), so what is enforced is what is parsed.

* ``agentlang``: agentlang's own tools prompt (models whose template has no tools):
  ``<tool_call>{"name": N, "arguments": {...}}</tool_call>``.
* ``hermes`` (Qwen2.5 / Qwen3, Hermes): ``<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>``.
* ``mistral``: ``[TOOL_CALLS][{"name": N, "arguments": {...}}]``.
* ``llama3_json`` (Llama 3.1+ with its JSON tool prompt): ``{"name": N, "parameters": {...}}``.
* ``functiongemma`` (FunctionGemma, Gemma 3's function-calling model):
  ``<start_function_call>call:N{k:<escape>text<escape>,n:1}<end_function_call>``, arguments in
  its own syntax (:mod:`agentlang.runtime.grammar.gemma_args`: grammar, parser); the tool's
  response turn, ``<start_function_response>``, stops the answer.

A reasoning block (``REASONING["think"]``: Qwen3's ``<think>…</think>``) may precede the
constrained part: the constraint then applies to what follows the block, not to the block.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from agentlang.runtime.grammar.gemma_args import ESCAPE, GemmaArgsError, args_grammar, parse_value
from agentlang.runtime.grammar.schema_support import check_schema_support


@dataclass(frozen=True)
class ToolFormat:
    name: str
    trigger: str           # starts a call in free text (the constraint's trigger)
    head: str              # before the call's name: begin = head + '{"name": ' + name
    args_key: str          # "arguments" or "parameters" (JSON formats)
    tail: str              # after the arguments object's closing brace
    gemma: bool = False    # FunctionGemma's call:NAME{k:v} instead of a JSON object
    stops: tuple[str, ...] = ()   # text that ends the answer (the tool's turn)
    sglang: tuple[str, ...] = ()  # SGLang's --tool-call-parser names for it (first: reported)

    def begin(self, name: str) -> str:
        if self.gemma:
            return f"{self.head}call:{name}"
        return f'{self.head}{{"name": {json.dumps(name)}, "{self.args_key}": '

    @property
    def end(self) -> str:
        return self.tail if self.gemma else "}" + self.tail

    @property
    def closers(self) -> tuple[bytes, ...]:
        """Words the budget guard's completion search tries first (its string delimiter)."""
        return (ESCAPE.encode(),) if self.gemma else ()

    def content(self, schema: dict) -> dict:
        """The structural-tag content of a call's arguments under ``schema``."""
        if not self.gemma:
            return {"type": "json_schema", "json_schema": schema}
        check_schema_support(schema, "functiongemma")
        return {"type": "grammar",
                "grammar": args_grammar(schema, (self.trigger, self.tail, *self.stops))}


FORMATS = {f.name: f for f in (
    ToolFormat("agentlang", "<tool_call>", "<tool_call>", "arguments", "</tool_call>"),
    ToolFormat("hermes", "<tool_call>", "<tool_call>\n", "arguments", "\n</tool_call>",
               sglang=("qwen25", "qwen")),
    ToolFormat("mistral", "[TOOL_CALLS]", "[TOOL_CALLS][", "arguments", "]", sglang=("mistral",)),
    ToolFormat("llama3_json", '{"name": ', "", "parameters", "", sglang=("llama3",)),
    ToolFormat("functiongemma", "<start_function_call>", "<start_function_call>", "",
               "<end_function_call>", gemma=True, stops=("<start_function_response>",)),
)}
REASONING = {"think": ("<think>", "</think>\n\n")}     # begin, end as Qwen3's template writes them
SGLANG_REASONING = {"think": "qwen3"}                   # SGLang's --reasoning-parser name


def format_of_parser(name: object) -> str | None:
    """The format a server's advertised tool-call parser names (SGLang's ``tool_call_parser``
    of ``/model_info``, e.g. ``"qwen25"``, or a key of :data:`FORMATS`); None if unknown."""
    if name in FORMATS:
        return str(name)
    return next((f.name for f in FORMATS.values() if name in f.sglang), None)


def structural_tag(fmt: str, tools: list[dict], forced: bool, reasoning: str | None,
                   schema_of=lambda s: s) -> dict:
    """The xgrammar structural tag of calls in format ``fmt`` to ``tools`` ([{name,
    parameters}]): free text with every started call valid, or (``forced``) one call and
    nothing else; after a reasoning block when ``reasoning`` is set. ``schema_of`` prepares
    each parameters schema (the backend bounds recursion)."""
    f = FORMATS[fmt]
    tags = [{"type": "tag", "begin": f.begin(t["name"]), "end": f.end,
             "content": f.content(schema_of(t["parameters"]))} for t in tools]
    if forced:
        body = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
    else:
        body = {"type": "triggered_tags", "triggers": [f.trigger], "tags": tags}
    return {"type": "structural_tag", "format": after_reasoning(body, reasoning)}


def after_reasoning(body: dict, reasoning: str | None) -> dict:
    """``body`` (a structural-tag format), optionally preceded by the reasoning block if one
    is set (a thinking model usually opens with it; the grammar does not force it)."""
    if reasoning is None:
        return body
    begin, end = REASONING[reasoning]
    think = {"type": "tag", "begin": begin, "content": {"type": "any_text"}, "end": end}
    return {"type": "or", "elements": [{"type": "sequence", "elements": [think, body]}, body]}


def parse_calls(fmt: str, text: str) -> tuple[list[tuple[str, object]], str | None] | None:
    """``([(name, arguments)], the text around the calls or None)`` in format ``fmt``, or None
    when ``text`` holds no well-formed call (validation against the tools is the caller's).
    Every format also accepts a bare ``{"name", "arguments" | "parameters"}`` object, or one in
    a Markdown fence, as the whole text (what a forced call in agentlang's format is)."""
    f = FORMATS[fmt]
    if f.gemma:
        return _gemma_calls(f, text)
    if fmt == "mistral" and f.trigger in text:
        before, _, after = text.partition(f.trigger)
        try:
            items, end = json.JSONDecoder().raw_decode(after.lstrip())
        except json.JSONDecodeError:
            return None
        items = items if isinstance(items, list) else [items]
        calls = [_call(i) for i in items]
        rest = (before + after.lstrip()[end:]).strip() or None
        return (calls, rest) if calls and None not in calls else None
    if fmt == "llama3_json" and f.trigger in text:       # each trigger opens a JSON call
        calls, rest, at = [], [], 0
        while (start := text.find(f.trigger, at)) >= 0:
            try:
                obj, end = json.JSONDecoder().raw_decode(text, start)
            except json.JSONDecodeError:
                return None
            calls.append(_call(obj))
            rest.append(text[at:start])
            at = end
        rest.append(text[at:])
        return (calls, "".join(rest).strip() or None) if None not in calls else None
    if f.trigger == "<tool_call>":
        blocks = list(_BLOCK.finditer(text))
        if blocks:
            calls = [_call(_loads(m.group(1))) for m in blocks]
            rest = _BLOCK.sub("", text).strip() or None
            return (calls, rest) if None not in calls else None
    stripped = text.strip()
    fence = _FENCE.match(stripped)
    call = _call(_loads(fence.group(1) if fence else stripped))
    return ([call], None) if call is not None else None


def _gemma_calls(f: ToolFormat, text: str) -> tuple[list[tuple[str, object]], str | None] | None:
    calls, rest, at = [], [], 0
    while (start := text.find(f.trigger, at)) >= 0:
        end = text.find(f.tail, start)
        m = _GEMMA_CALL.match(text, start + len(f.trigger), end if end >= 0 else len(text))
        if end < 0 or m is None:
            return None
        try:
            args = parse_value(m.group(2))
        except GemmaArgsError:
            return None
        if not isinstance(args, dict):
            return None
        calls.append((m.group(1), args))
        rest.append(text[at:start])
        at = end + len(f.tail)
    rest.append(text[at:])
    return (calls, "".join(rest).strip() or None) if calls else None


_GEMMA_CALL = re.compile(r"call:([A-Za-z0-9_.-]+)(\{.*\})$", re.S)
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _call(obj: object) -> tuple[str, object] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) \
            or set(obj) - {"name", "arguments", "parameters"}:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = _loads(args)
    return (obj["name"], args) if isinstance(args, dict) else None
