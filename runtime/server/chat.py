"""Chat messages from OpenAI requests → the plain ``{"role", "content"}`` list the engine's chat
template renders.

Content may be a string or a list of ``{"type": "text", "text": ...}`` parts (joined); role
``developer`` is an alias of ``system``; an assistant turn's ``tool_calls`` are rendered as the
``<tool_call>`` blocks the tool prompt asks for, so a conversation replays the way it was
generated — or, for a model whose template renders tools itself (``structured_calls``), kept
as ``tool_calls`` with parsed arguments (and a tool turn's ``tool_call_id`` / ``name``) for the
template to write in its own format. Every problem raises a 400 naming ``messages[i]...``.
"""

from __future__ import annotations

import json

from agentlang.runtime.server.errors import bad_request
from agentlang.runtime.server.protocol import ROLES, ChatMessage
from agentlang.runtime.server.tools import ToolPlan


def normalize_messages(messages: list[ChatMessage], field: str = "messages",
                       structured_calls: bool = False) -> list[dict]:
    if not messages:
        raise bad_request(f"{field}: must contain at least one message", field)
    out = []
    for i, m in enumerate(messages):
        where = f"{field}[{i}]"
        if m.role not in ROLES:
            raise bad_request(f"{where}.role: must be one of {list(ROLES)}, got {m.role!r}",
                              f"{where}.role")
        text = _content_text(m.content, f"{where}.content")
        calls = _parse_tool_calls(m.tool_calls or [], f"{where}.tool_calls")
        if calls and not structured_calls:
            text += "\n".join(f"<tool_call>{json.dumps(c, ensure_ascii=False)}</tool_call>"
                               for c in calls)
        if m.content is None and not m.tool_calls:
            raise bad_request(f"{where}.content: is required (only an assistant turn with "
                              "tool_calls may omit it)", f"{where}.content")
        if m.tool_calls and m.role != "assistant":
            raise bad_request(f"{where}.tool_calls: only assistant messages have tool calls",
                              f"{where}.tool_calls")
        role = "system" if m.role == "developer" else m.role
        msg = {"role": role, "content": text}
        if structured_calls:
            if calls:
                msg["tool_calls"] = [{"id": (m.tool_calls[j] or {}).get("id") or f"call_{i}_{j}",
                                      "type": "function", "function": c}
                                     for j, c in enumerate(calls)]
            msg.update({k: getattr(m, k) for k in ("tool_call_id", "name") if getattr(m, k)})
        out.append(msg)
    return out


def with_tool_prompt(messages: list[dict], plan: ToolPlan) -> list[dict]:
    """Describe the tools in the system prompt (appended to an existing system message)."""
    if not plan.active:
        return messages
    prompt = plan.system_prompt()
    if messages[0]["role"] == "system":
        first = {"role": "system", "content": messages[0]["content"].rstrip() + "\n\n" + prompt}
        return [first] + messages[1:]
    return [{"role": "system", "content": prompt}] + messages


def _content_text(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{where}[{j}]: only text parts "
                                  f'({{"type": "text", "text": ...}}) are supported, got {kind!r}',
                                  f"{where}[{j}]")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"{where}: must be a string or a list of text parts, "
                      f"got {type(content).__name__}", where)


def _parse_tool_calls(calls: list[dict], where: str) -> list[dict]:
    """Each call as ``{"name", "arguments": <parsed object>}``."""
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}[{j}].function: must be an object with a name",
                              f"{where}[{j}].function")
        args = fn.get("arguments", "{}")
        try:
            args_obj = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            raise bad_request(f"{where}[{j}].function.arguments: not valid JSON",
                              f"{where}[{j}].function.arguments") from None
        out.append({"name": fn["name"], "arguments": args_obj})
    return out
