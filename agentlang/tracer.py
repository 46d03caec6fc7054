"""The tracer: run a program on placeholder arguments and record its dependency graph.

``trace_program`` calls the program function with a ``ProgramState`` over a ``TraceStream``.
Arguments not given concretely are ``Argument`` placeholders; ``s["x"]`` returns a
``Variable`` placeholder pointing at the node that writes ``x``. Using a placeholder where a
value is needed raises ``TraceError`` (ir.py) explaining how to write the line instead.

``prompt_prefix`` mode stops at the root stream's first generation: ``run_batch`` uses it
with concrete arguments to find what each program sends first (to order the batch and cache
shared prefixes) without running user code past that point.
"""

from __future__ import annotations

from typing import Any

from agentlang.api import program_body
from agentlang.chat_template import ChatTemplate
from agentlang.graph import Edge, Graph, Node, short
from agentlang.ir import (AgentLoop, Argument, Expr, Gen, Join, RoleBegin, RoleEnd, Select,
                          SeparateReasoning, Text,
                          ToolCall, TraceError, Variable, VarScopeBegin, VarScopeEnd, handler,
                          leaves)
from agentlang.state import ProgramState

_FILL = (Text, Argument, Variable)   # consecutive fills make one text node


class _StopTrace(BaseException):
    """Internal: the prompt prefix is known; stop running the program body (a BaseException
    so that a program's own ``except Exception`` does not swallow it)."""


class GraphBuilder:
    def __init__(self, template: ChatTemplate, stop_at_first_generation: bool = False):
        self.template = template
        self.stop_at_first_generation = stop_at_first_generation
        self.nodes: list[Node] = []
        self.edges: list[Edge] = []
        self.stream_parent: dict[int, int | None] = {}
        self.arg_nodes: dict[str, int] = {}
        self.prompt_prefix: str | None = None
        self.constant_prefix: str | None = None

    def new_node(self, kind: str, label: str, stream: int | None, reads=(), writes=None,
                 expr: Any = None) -> int:
        node = Node(len(self.nodes), kind, label, stream, tuple(reads), writes, expr)
        self.nodes.append(node)
        return node.id

    def argument(self, name: str) -> int:
        if name not in self.arg_nodes:
            self.arg_nodes[name] = self.new_node("argument", name, None)
        return self.arg_nodes[name]


class TraceStream:
    """Implements the stream protocol of ``ProgramState`` by recording nodes."""

    def __init__(self, b: GraphBuilder, parent: TraceStream | None = None,
                 fork_node: int | None = None):
        self.b = b
        self.sid = len(b.stream_parent)
        b.stream_parent[self.sid] = parent.sid if parent else None
        self.last = fork_node
        self.entry_kind = "fork" if fork_node is not None else "seq"
        self.writers: dict[str, int] = dict(parent.writers) if parent else {}
        self.values: dict[str, Any] = dict(parent.values) if parent else {}
        self.written: set[str] = set()
        self.text_ = parent.text_ if parent else ""
        self.fork_start = len(self.text_)
        self.messages_: list[dict] = list(parent.messages_) if parent else []
        self.role: str | None = parent.role if parent else None
        self.role_begin = parent.role_begin if parent else 0

    # -- recording ---------------------------------------------------------------------
    def _add(self, kind: str, label: str, reads=(), writes=None, expr=None) -> int:
        nid = self.b.new_node(kind, label, self.sid, reads, writes, expr)
        if self.last is not None:
            self.b.edges.append(Edge(self.last, nid, self.entry_kind))
        self.entry_kind = "seq"
        for name in reads:
            if name.startswith("arg:"):
                self.b.edges.append(Edge(self.b.argument(name[4:]), nid, "data", name[4:]))
            elif name in self.writers:
                self.b.edges.append(Edge(self.writers[name], nid, "data", name))
        if writes is not None:
            self.writers[writes] = nid
            self.written.add(writes)
        self.last = nid
        return nid

    def _is_root(self) -> bool:
        return self.b.stream_parent[self.sid] is None

    def _mark_prefix(self, constant_only: bool) -> None:
        if not self._is_root():
            return
        if self.b.constant_prefix is None:
            self.b.constant_prefix = self.text_
        if not constant_only and self.b.prompt_prefix is None:
            self.b.prompt_prefix = self.text_
            if self.b.stop_at_first_generation:
                raise _StopTrace

    def submit(self, expr: Expr) -> None:
        fills: list[Expr] = []
        for leaf in leaves(expr) + (None,):
            if isinstance(leaf, _FILL):
                fills.append(leaf)
                continue
            if fills:
                self._fill_node(fills)
                fills = []
            if leaf is not None:
                self._leaf(leaf)

    def _fill_node(self, fills: list[Expr]) -> None:
        label, reads = "", []
        for leaf in fills:
            if isinstance(leaf, Text):
                label += leaf.value
                self.text_ += leaf.value
                continue
            self._mark_prefix(constant_only=True)
            label += "{" + leaf.name + "}"
            self.text_ += "{" + leaf.name + "}"
            reads.append(("arg:" + leaf.name) if isinstance(leaf, Argument) else leaf.name)
        self._add(Text.kind, short(label), reads, expr=tuple(fills))

    def _leaf(self, leaf: Expr) -> None:
        try:
            trace = handler(self, "trace_", leaf)
        except TypeError as e:
            raise TraceError(str(e)) from None
        trace(leaf)

    def _generating(self, label: str, leaf: Expr, placeholder: str) -> None:
        self._mark_prefix(constant_only=False)
        self._add(leaf.kind, label, writes=leaf.name, expr=leaf)
        self.text_ += "{" + placeholder + "}"

    def trace_gen(self, leaf: Gen) -> None:
        self._generating(f"gen {leaf.name or ''}".rstrip(), leaf, leaf.name or "gen")

    def trace_select(self, leaf: Select) -> None:
        self._generating(f"select {leaf.name or ''}: {'|'.join(leaf.choices)}", leaf,
                         leaf.name or "select")

    def trace_tool_call(self, leaf: ToolCall) -> None:
        names = "|".join(t.name for t in leaf.tools)
        self._generating(f"tool_call {names}", leaf, "tool_call")

    def trace_agent_loop(self, leaf: AgentLoop) -> None:
        names = ", ".join(t.name for t in leaf.tools)
        self._generating(f"agent_loop [{names}] → {leaf.name}", leaf, "agent_loop")

    def trace_separate_reasoning(self, leaf: SeparateReasoning) -> None:
        nid = self._add(leaf.kind, f"separate_reasoning {leaf.name}", reads=[leaf.name],
                        writes=leaf.reasoning_name, expr=leaf)
        self.writers[leaf.name] = nid           # it rewrites the gen's variable too
        self.values.pop(leaf.name, None)

    def trace_role_begin(self, leaf: RoleBegin) -> None:
        text, messages = self.b.template.open_role(leaf.role,
                                                   not self.messages_ and self.role is None)
        self.messages_.extend(messages)
        self._add(leaf.kind, f"<{leaf.role}>", expr=leaf)
        self.text_ += text
        self.role, self.role_begin = leaf.role, len(self.text_)

    def trace_role_end(self, leaf: RoleEnd) -> None:
        self._add(leaf.kind, f"</{leaf.role}>", expr=leaf)
        self.messages_.append({"role": leaf.role, "content": self.text_[self.role_begin:]})
        self.text_ += self.b.template.close_role(leaf.role)
        self.role = None

    def trace_var_scope_begin(self, leaf: VarScopeBegin) -> None:
        self._add(leaf.kind, f"var_scope {leaf.name} ▶", expr=leaf)

    def trace_var_scope_end(self, leaf: VarScopeEnd) -> None:
        self._add(leaf.kind, f"◀ var_scope {leaf.name}", writes=leaf.name, expr=leaf)

    # -- stream protocol -----------------------------------------------------------------
    def fork_streams(self, size: int) -> tuple[list[TraceStream], int]:
        self._mark_prefix(constant_only=False)
        fork = self._add("fork", f"fork({size})")
        return [TraceStream(self.b, self, fork) for _ in range(size)], fork

    def join_streams(self, fork: int, streams: list[TraceStream], mode: str) -> None:
        join = self._add("join", f"join ({mode})", expr=Join(mode))
        for child in streams:
            self.b.edges.append(Edge(child.last if child.last is not None else fork, join,
                                     "join"))
        if mode == "gather_variable":
            for name in sorted(set().union(*(c.written for c in streams))):
                self.writers[name] = join
                self.written.add(name)
                self.values.pop(name, None)
        else:
            self.text_ += "".join(c.text_[c.fork_start:] for c in streams)

    def get_var(self, name: str) -> Any:
        if name in self.values:
            return self.values[name]
        if name not in self.writers:
            raise KeyError(f"no variable {name!r} in this state; defined: "
                           f"{sorted(set(self.writers) | set(self.values))}")
        return Variable(name, self.writers[name])

    def set_var(self, name: str, value: Any) -> None:
        self.values[name] = value
        self.writers.pop(name, None)

    def has_var(self, name: str) -> bool:
        return name in self.values or name in self.writers

    def get_meta_info(self, name: str) -> Any:
        self.get_var(name)
        return None

    def text(self) -> str:
        return self.text_

    def messages(self) -> list[dict]:
        return list(self.messages_)

    def sync(self) -> None:
        pass

    def iter_text(self, name: str | None = None):
        yield self.text_ if name is None else self.get_var(name)


def trace_program(program: Any, template: ChatTemplate, arguments: dict[str, Any],
                  strict: bool = True, stop_at_first_generation: bool = False) -> Graph:
    """Trace ``program`` with ``arguments`` (missing ones take their default value or become
    placeholders). ``strict``:
    errors propagate; otherwise the graph so far is returned with ``truncated`` set."""
    builder = GraphBuilder(template, stop_at_first_generation)
    root = TraceStream(builder)
    args = {}
    for param in program.params:  # missing: the default if there is one, else a placeholder
        if param.name in arguments:
            args[param.name] = arguments[param.name]
        elif param.default is not param.empty:
            args[param.name] = param.default
        else:
            args[param.name] = Argument(param.name)
    for name, value in arguments.items():
        args.setdefault(name, value)
    truncated = None
    try:
        with program_body():
            program.func(ProgramState(root), **args)
    except _StopTrace:
        pass
    except Exception as e:  # noqa: BLE001 - non-strict traces keep what was recorded
        if strict:
            raise
        truncated = f"{type(e).__name__}: {e}"
    text = root.text_
    return Graph(name=program.name, nodes=tuple(builder.nodes), edges=tuple(builder.edges),
                 stream_parent=dict(builder.stream_parent),
                 prompt_prefix=builder.prompt_prefix if builder.prompt_prefix is not None
                 else text,
                 constant_prefix=builder.constant_prefix if builder.constant_prefix is not None
                 else text,
                 truncated=truncated)
