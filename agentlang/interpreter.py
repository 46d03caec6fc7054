"""The interpreter: a visitor over IR nodes, one ``visit_*`` method per node type.

``Interpreter`` is mixed into ``StreamExecutor`` (executor.py), which supplies the stream
state (``text_``, ``messages_``, ``variables``) and helpers (``fill``, ``store_var``,
``generate_text``, ``resolve``). Visitor methods run on the stream's worker thread.
"""

from __future__ import annotations

import json
import math
from typing import Any

from agentlang import agent
from agentlang.ir import (AgentLoop, Concat, Gen, RoleBegin, RoleEnd, Select, Text,
                          ToolCall, VarScopeBegin, VarScopeEnd)


class Interpreter:
    def execute(self, node: Any) -> None:
        getattr(self, "visit_" + type(node).__name__.lower().lstrip("_"))(node)

    def visit_text(self, node: Text) -> None:
        self.fill(node.value)

    def visit_concat(self, node: Concat) -> None:
        for item in node.items:
            self.execute(item)

    def visit_gen(self, node: Gen) -> None:
        opts = self.resolve(node.options)
        text, result = self.generate_text(opts, node.name)
        meta = {**result.meta, "finish_reason": {"type": result.finish_reason,
                                                 "matched": result.matched_stop}}
        if result.token_logprobs is not None:
            meta["output_token_logprobs"] = [(lp, tid) for lp, tid, _ in result.token_logprobs]
            meta["output_top_logprobs"] = [top for _, _, top in result.token_logprobs]
        self.store_var(node.name, typed_value(text, opts.value_type, node.name), meta)

    def visit_select(self, node: Select) -> None:
        backend, choices = self.ctx.backend, list(node.choices)
        logprobs = backend.score(self.text_, choices)
        uncond = backend.score("", choices) if node.method.requires_unconditional else None
        decision = node.method(choices, logprobs, uncond)
        index = decision.index
        if node.temperature > 0:
            top = max(decision.scores)
            weights = [math.exp((sc - top) / node.temperature) for sc in decision.scores]
            index = self.ctx.rng.choices(range(len(choices)), weights=weights)[0]
        self.fill(choices[index])
        self.store_var(node.name, choices[index], {**decision.meta, "scores": decision.scores})

    def visit_rolebegin(self, node: RoleBegin) -> None:
        template = self.ctx.template
        if not self.messages_ and self.cur_role is None:
            self.fill(template.preamble)
            if node.role != "system" and template.default_system_prompt is not None:
                pre, suf = template.prefix_and_suffix("system")
                self.fill(pre + template.default_system_prompt + suf)
                self.messages_.append({"role": "system",
                                       "content": template.default_system_prompt})
        self.fill(template.prefix_and_suffix(node.role)[0])
        self.cur_role, self.cur_role_begin = node.role, len(self.text_)

    def visit_roleend(self, node: RoleEnd) -> None:
        content = self.text_[self.cur_role_begin:]
        self.fill(self.ctx.template.prefix_and_suffix(node.role)[1])
        self.messages_.append({"role": node.role, "content": content})
        self.cur_role = None

    def visit_varscopebegin(self, node: VarScopeBegin) -> None:
        self.scopes[node.name] = len(self.text_)

    def visit_varscopeend(self, node: VarScopeEnd) -> None:
        self.store_var(node.name, self.text_[self.scopes.pop(node.name):])

    def visit_toolcall(self, node: ToolCall) -> None:
        agent.execute_tool_call(self, node)

    def visit_agentloop(self, node: AgentLoop) -> None:
        agent.execute_agent_loop(self, node)

    def visit_joinitem(self, item: Any) -> None:
        children = item.record.children
        for child in children:
            child.end()
        for child in children:
            child.worker.join()
        try:
            for child in children:
                if child.error_ is not None:
                    raise child.error_
            if item.mode == "gather_variable":
                names = sorted(set().union(*(c.written for c in children)))
                for name in names:
                    self.store_var(name, [c.variables.get(name) for c in children],
                                 [c.meta_info.get(name) for c in children])
            else:  # concate_and_append
                self.fill("".join(c.text_[c.fork_start:] for c in children))
                for c in children:
                    self.messages_.extend(c.messages_[c.fork_messages:])
        finally:
            self.ctx.release(item.record)


def typed_value(text: str, value_type: str | None, name: str | None) -> Any:
    """The Python value of a typed gen's text (gen_int → int, …); plain gens keep text."""
    if value_type is None:
        return text
    raw = text.strip()
    try:
        if value_type == "int":
            return int(raw)
        if value_type == "float":
            return float(raw)
        if value_type == "bool":
            return {"true": True, "false": False}[raw.lower()]
        if len(raw) >= 2 and raw[0] == raw[-1] == '"':
            return json.loads(raw)
        return raw
    except (ValueError, KeyError):
        raise ValueError(f"gen {name!r} with dtype {value_type} produced {text!r}, which is not "
                         f"a {value_type} (the generation probably hit max_tokens)") from None
