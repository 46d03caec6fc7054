"""Role markers of a chat template, derived from the model's own template renderer.

Programs build text incrementally (``s += user_begin()`` … ``user_end()``), so the
interpreter needs each role's prefix and suffix strings. ``derive_chat_template`` obtains
them from any ``render(messages, add_generation_prompt) -> str`` (the tokenizer's Jinja
template through ``Engine.apply_chat_template`` or the server's ``/apply_chat_template``) by
rendering sentinel messages and cutting around the sentinels. The text a program builds is
then exactly what the template renders for the same conversation, including a default
system prompt the template inserts when the first message is not a system message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Render = Callable[[list[dict], bool], str]

_SENT = {"system": "\u2983AGL_SYSTEM_7F3A\u2984", "user": "\u2983AGL_USER_7F3A\u2984",
         "assistant": "\u2983AGL_ASSISTANT_7F3A\u2984", "tool": "\u2983AGL_TOOL_7F3A\u2984"}


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    role_prefix: dict[str, str]
    role_suffix: dict[str, str]
    default_system_prompt: str | None = None
    preamble: str = ""  # emitted once before the first message (e.g. a BOS token)
    stop_str: tuple[str, ...] = ()
    # prefix and suffix used for roles the template was not probed with
    generic_prefix: str = ""  # contains "{role}"
    generic_suffix: str = ""

    def prefix_and_suffix(self, role: str) -> tuple[str, str]:
        if role in self.role_prefix:
            return self.role_prefix[role], self.role_suffix[role]
        if not self.generic_prefix:
            raise ValueError(f"chat template {self.name!r} has no markers for role {role!r}")
        return self.generic_prefix.replace("{role}", role), self.generic_suffix

    def open_role(self, role: str, first: bool) -> tuple[str, list[dict]]:
        """The text that opens ``role`` and the messages it adds before the role's own. The
        one rendering of a role's start, shared by the interpreter and the tracer.
        ``first``: nothing was said yet (no message, no open role), so the preamble and —
        unless ``role`` is ``system`` — the default system prompt come first."""
        text, messages = "", []
        if first:
            text = self.preamble
            if role != "system" and self.default_system_prompt is not None:
                pre, suf = self.prefix_and_suffix("system")
                text += pre + self.default_system_prompt + suf
                messages.append({"role": "system", "content": self.default_system_prompt})
        return text + self.prefix_and_suffix(role)[0], messages

    def close_role(self, role: str) -> str:
        """The text that closes ``role`` (its content is what was appended since it opened)."""
        return self.prefix_and_suffix(role)[1]

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """Render a message list the way the interpreter would build it."""
        out = self.preamble if messages else ""
        if messages and messages[0]["role"] != "system" and self.default_system_prompt:
            messages = [{"role": "system", "content": self.default_system_prompt}, *messages]
        for m in messages:
            pre, suf = self.prefix_and_suffix(m["role"])
            out += pre + m["content"] + suf
        if add_generation_prompt:
            out += self.prefix_and_suffix("assistant")[0]
        return out


def chatml(default_system_prompt: str | None = None) -> ChatTemplate:
    """The ChatML template (SmolLM2, Qwen2): ``<|im_start|>role\\n…<|im_end|>\\n``."""
    roles = ("system", "user", "assistant", "tool")
    return ChatTemplate(
        name="chatml",
        role_prefix={r: f"<|im_start|>{r}\n" for r in roles},
        role_suffix={r: "<|im_end|>\n" for r in roles},
        default_system_prompt=default_system_prompt,
        stop_str=("<|im_end|>",),
        generic_prefix="<|im_start|>{role}\n", generic_suffix="<|im_end|>\n")


def _cut(text: str, sentinel: str, start: int) -> tuple[str, int]:
    """Text from ``start`` up to the sentinel, and the index just past the sentinel."""
    i = text.find(sentinel, start)
    if i < 0:
        raise ValueError("chat template dropped a message's content; it cannot be "
                         "rendered incrementally")
    return text[start:i], i + len(sentinel)


def derive_chat_template(render: Render, name: str = "model") -> ChatTemplate:
    """Probe ``render`` with sentinel messages; raises ValueError for templates that do not
    render each message as prefix + content + suffix (e.g. ones merging system into user)."""
    try:
        return _derive(render, name)
    except (ValueError, IndexError) as e:
        if str(e).startswith("chat template"):
            raise
        raise ValueError(f"chat template {name!r} cannot be rendered message by message "
                         f"({e}); agentlang needs prefix + content + suffix per message") from None


def _derive(render: Render, name: str) -> ChatTemplate:
    s, u, a = _SENT["system"], _SENT["user"], _SENT["assistant"]
    full = render([{"role": "system", "content": s}, {"role": "user", "content": u},
                   {"role": "assistant", "content": a}], False)
    sys_pre, pos = _cut(full, s, 0)
    user_pre_raw, pos_u = _cut(full, u, pos)
    asst_pre_raw, pos_a = _cut(full, a, pos_u)
    asst_suf = full[pos_a:]
    # Split "suffix of previous + prefix of next" using the one-message renders.
    only_sys = render([{"role": "system", "content": s}], False)
    sys_suf = only_sys[only_sys.index(s) + len(s):]
    if not user_pre_raw.startswith(sys_suf):
        raise ValueError(f"chat template {name!r} is not prefix/suffix structured")
    user_pre = user_pre_raw[len(sys_suf):]
    su = render([{"role": "system", "content": s}, {"role": "user", "content": u}], False)
    user_suf = su[su.index(u) + len(u):]
    if not asst_pre_raw.startswith(user_suf):
        raise ValueError(f"chat template {name!r} is not prefix/suffix structured")
    asst_pre = asst_pre_raw[len(user_suf):]
    # A template-inserted default system prompt shows up before a leading user message.
    only_user = render([{"role": "user", "content": u}], False)
    before_user = only_user[:only_user.index(u)]
    if not before_user.endswith(user_pre):
        raise ValueError(f"chat template {name!r} renders a leading user message differently")
    block = before_user[:len(before_user) - len(user_pre)]
    default_system, preamble = None, ""
    if block.startswith(sys_pre) and block.endswith(sys_suf) and len(block) >= len(sys_pre) + \
            len(sys_suf):
        default_system = block[len(sys_pre):len(block) - len(sys_suf)]
    elif block and sys_pre.startswith(block):  # e.g. a BOS token before the first message
        preamble, sys_pre = block, sys_pre[len(block):]
    elif block:
        raise ValueError(f"chat template {name!r} inserts text that is not a system message")
    # Generic role markers, from a probe with a role the template may not know.
    generic_pre = generic_suf = ""
    t = _SENT["tool"]
    try:
        tool = render([{"role": "system", "content": s}, {"role": "tool", "content": t}], False)
        tool_pre_raw, p = _cut(tool, t, tool.index(s) + len(s))
        if tool_pre_raw.startswith(sys_suf) and "tool" in tool_pre_raw:
            generic_pre = tool_pre_raw[len(sys_suf):].replace("tool", "{role}")
            generic_suf = tool[p:]
    except Exception:  # noqa: BLE001 - templates may reject unknown roles; then none is known
        pass
    stop = asst_suf.strip()
    return ChatTemplate(
        name=name,
        role_prefix={"system": sys_pre, "user": user_pre, "assistant": asst_pre},
        role_suffix={"system": sys_suf, "user": user_suf, "assistant": asst_suf},
        default_system_prompt=default_system,
        preamble=preamble,
        stop_str=(stop,) if stop else (),
        generic_prefix=generic_pre, generic_suffix=generic_suf)
