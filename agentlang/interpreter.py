"""The interpreter: a visitor over IR nodes, one ``visit_<kind>`` method per leaf kind,
dispatched by :func:`agentlang.ir.handler` (the one dispatch every pass uses).

It runs a stream's submitted nodes on the stream's worker thread and touches the stream only
through the :class:`~agentlang.stream.Stream` protocol (``StreamExecutor`` in executor.py implements it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from agentlang import agent
from agentlang.ir import (AgentLoop, Expr, Gen, RoleBegin, RoleEnd, Select, SeparateReasoning,
                          Text, ToolCall,
                          VarScopeBegin, VarScopeEnd, handler, leaves)
from agentlang.stream import Stream


@dataclass(frozen=True)
class JoinItem:
    """Queued on the parent stream by ``join``: wait for the fork's children, merge them."""

    kind: ClassVar[str] = "join"
    record: Any                   # executor.ForkRecord: children and the prefix handle
    mode: str                     # a join mode of state.JOIN_MODES


class Interpreter:
    def __init__(self, stream: Stream):
        self.s = stream

    def execute(self, node: Expr | JoinItem) -> None:
        for leaf in leaves(node) if isinstance(node, Expr) else (node,):
            handler(self, "visit_", leaf)(leaf)

    def visit_text(self, node: Text) -> None:
        self.s.fill(node.value)

    def visit_gen(self, node: Gen) -> None:
        opts = self.s.resolve(node.options)
        text, result = self.s.generate_text(opts, node.name)
        meta = {**result.meta, "finish_reason": {"type": result.finish_reason,
                                                 "matched": result.matched_stop}}
        if result.token_logprobs is not None:
            meta["output_token_logprobs"] = [(lp, tid) for lp, tid, _ in result.token_logprobs]
            meta["output_top_logprobs"] = [top for _, _, top in result.token_logprobs]
        self.s.store_var(node.name, typed_value(text, opts.value_type, node.name), meta)

    def visit_select(self, node: Select) -> None:
        ctx, choices = self.s.ctx, list(node.choices)
        logprobs = ctx.backend.score(self.s.text_, choices)
        uncond = ctx.backend.score("", choices) if node.method.requires_unconditional else None
        decision = node.method(choices, logprobs, uncond)
        index = decision.index
        if node.temperature > 0:
            top = max(decision.scores)
            weights = [math.exp((sc - top) / node.temperature) for sc in decision.scores]
            index = ctx.rng.choices(range(len(choices)), weights=weights)[0]
        self.s.fill(choices[index])
        self.s.store_var(node.name, choices[index], {**decision.meta, "scores": decision.scores})

    def visit_separate_reasoning(self, node: SeparateReasoning) -> None:
        from agentlang.runtime.chat.reasoning import split_reasoning

        text = self.s.variables.get(node.name)
        if not isinstance(text, str):
            raise TypeError(f"separate_reasoning: variable {node.name!r} holds "
                            f"{type(text).__name__}, not text (a typed gen has no reasoning block)")
        reasoning, answer = split_reasoning(text, node.model_type)
        self.s.replace_tail(text, answer)
        self.s.store_var(node.name, answer, self.s.meta_info.get(node.name))
        self.s.store_var(node.reasoning_name, reasoning)

    def visit_role_begin(self, node: RoleBegin) -> None:
        self.s.begin_role(node.role)

    def visit_role_end(self, node: RoleEnd) -> None:
        self.s.end_role(node.role)

    def visit_var_scope_begin(self, node: VarScopeBegin) -> None:
        self.s.scopes[node.name] = len(self.s.text_)

    def visit_var_scope_end(self, node: VarScopeEnd) -> None:
        self.s.store_var(node.name, self.s.text_[self.s.scopes.pop(node.name):])

    def visit_tool_call(self, node: ToolCall) -> None:
        agent.execute_tool_call(self.s, node)

    def visit_agent_loop(self, node: AgentLoop) -> None:
        agent.execute_agent_loop(self.s, node)

    def visit_join(self, item: JoinItem) -> None:
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
                    self.s.store_var(name, [c.variables.get(name) for c in children],
                                     [c.meta_info.get(name) for c in children])
            else:  # concate_and_append
                self.s.fill("".join(c.text_[c.fork_start:] for c in children))
                for c in children:
                    self.s.messages_.extend(c.messages_[c.fork_messages:])
        finally:
            self.s.ctx.release(item.record)


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
            return json.loads(raw, strict=False)   # REGEX_STR's \s admits tabs and newlines
        return raw
    except (ValueError, KeyError):
        raise ValueError(f"gen {name!r} with dtype {value_type} produced {text!r}, which is not "
                         f"a {value_type} (the generation probably hit max_tokens)") from None
