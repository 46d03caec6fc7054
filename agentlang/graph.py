"""The dependency graph a trace produces, and its DOT / Mermaid renderings.

Nodes are the program's steps (text, gen, select, role markers, tool calls, fork, join) and
its arguments. Edges:

- ``seq``: a node depends on the node before it in its stream (the text it continues);
- ``data``: a node reads a variable or argument written/provided by the source node;
- ``fork``: a child stream starts from the fork node of its parent;
- ``join``: the last node of each child stream feeds the parent's join node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

KINDS = ("argument", "text", "gen", "select", "role_begin", "role_end", "var_scope_begin",
         "var_scope_end", "tool_call", "agent_loop", "fork", "join")
# fill colour per node kind (DOT and the matplotlib drawing); other kinds are white
KIND_COLORS = MappingProxyType({
    "gen": "#cfe8ff", "select": "#ffe3b3", "argument": "#e8e8e8", "tool_call": "#d9f2d0",
    "agent_loop": "#d9f2d0", "fork": "#f4c7c3", "join": "#f4c7c3"})


@dataclass(frozen=True)
class Node:
    id: int
    kind: str
    label: str
    stream: int | None            # None for argument nodes
    reads: tuple[str, ...] = ()
    writes: str | None = None
    expr: Any = None


@dataclass(frozen=True)
class Edge:
    src: int
    dst: int
    kind: str                     # "seq" | "data" | "fork" | "join"
    label: str = ""


@dataclass(frozen=True)
class Graph:
    name: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    stream_parent: dict[int, int | None] = field(default_factory=dict)
    prompt_prefix: str = ""       # root text before its first generation (or fork)
    constant_prefix: str = ""     # root text before its first argument/variable/generation
    truncated: str | None = None  # why the trace stopped early (non-strict traces only)

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def nodes_of(self, kind: str) -> list[Node]:
        return [n for n in self.nodes if n.kind == kind]

    def edges_of(self, kind: str) -> list[Edge]:
        return [e for e in self.edges if e.kind == kind]

    def predecessors(self, node_id: int, kind: str | None = None) -> list[int]:
        return [e.src for e in self.edges if e.dst == node_id and kind in (None, e.kind)]

    def successors(self, node_id: int, kind: str | None = None) -> list[int]:
        return [e.dst for e in self.edges if e.src == node_id and kind in (None, e.kind)]

    def stream_nodes(self, stream: int) -> list[Node]:
        return [n for n in self.nodes if n.stream == stream]

    def draw(self, path: str) -> None:
        """Save a picture (.png, .svg or .pdf, by extension) drawn with matplotlib."""
        from agentlang.draw import draw_graph

        draw_graph(self, path)

    # -- text renderings ---------------------------------------------------------------
    def to_dot(self) -> str:
        shapes = {"argument": "parallelogram", "gen": "box", "select": "hexagon",
                  "fork": "triangle", "join": "invtriangle", "tool_call": "component",
                  "agent_loop": "component"}
        fills = KIND_COLORS
        lines = [f'digraph "{_dot_escape(self.name)}" {{', "  rankdir=TB;",
                 '  node [shape=box, style="rounded,filled", fillcolor=white, fontsize=10];']
        args = [n for n in self.nodes if n.stream is None]
        for node in args:
            lines.append("  " + self._dot_node(node, shapes, fills))
        for stream in sorted(self.stream_parent):
            lines.append(f'  subgraph cluster_{stream} {{ label="{_stream_label(stream, self)}"; '
                         f'style=dashed; color=gray;')
            for node in self.stream_nodes(stream):
                lines.append("    " + self._dot_node(node, shapes, fills))
            lines.append("  }")
        styles = {"seq": [], "data": ["style=dashed", "color=blue"],
                  "fork": ["color=red", "penwidth=2"], "join": ["color=red", "penwidth=2"]}
        for e in self.edges:
            attrs = styles[e.kind] + ([f'label="{_dot_escape(e.label)}"'] if e.label else [])
            lines.append(f"  n{e.src} -> n{e.dst}" + (f" [{', '.join(attrs)}]" if attrs else "")
                         + ";")
        lines.append("}")
        return "\n".join(lines) + "\n"

    @staticmethod
    def _dot_node(node: Node, shapes: dict, fills: dict) -> str:
        return (f'n{node.id} [label="{_dot_escape(node.label)}", '
                f'shape={shapes.get(node.kind, "box")}, fillcolor="{fills.get(node.kind, "white")}"];')

    def to_mermaid(self) -> str:
        brackets = {"argument": ("[/", "/]"), "gen": ("([", "])"), "select": ("{{", "}}"),
                    "fork": ("{", "}"), "join": ("{", "}"), "tool_call": ("[[", "]]"),
                    "agent_loop": ("[[", "]]")}
        lines = ["flowchart TD"]
        for node in self.nodes:
            if node.stream is None:
                lines.append("  " + self._mermaid_node(node, brackets))
        for stream in sorted(self.stream_parent):
            lines.append(f'  subgraph s{stream} ["{_stream_label(stream, self)}"]')
            for node in self.stream_nodes(stream):
                lines.append("    " + self._mermaid_node(node, brackets))
            lines.append("  end")
        arrows = {"seq": "-->", "data": "-.->", "fork": "==>", "join": "==>"}
        for e in self.edges:
            label = f"|{_mermaid_escape(e.label)}|" if e.label else ""
            lines.append(f"  n{e.src} {arrows[e.kind]}{label} n{e.dst}")
        return "\n".join(lines) + "\n"

    @staticmethod
    def _mermaid_node(node: Node, brackets: dict) -> str:
        left, right = brackets.get(node.kind, ("[", "]"))
        return f'n{node.id}{left}"{_mermaid_escape(node.label)}"{right}'


def _stream_label(stream: int, graph: Graph) -> str:
    return "main" if graph.stream_parent.get(stream) is None else f"stream {stream}"


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _mermaid_escape(text: str) -> str:
    return (text.replace('"', "#quot;").replace("\n", "⏎").replace("|", "#124;")
            .replace("<", "#lt;").replace(">", "#gt;"))


def short(text: str, limit: int = 36) -> str:
    """A one-line node label."""
    text = text.replace("\n", "⏎")
    return text if len(text) <= limit else text[:limit - 1] + "…"
