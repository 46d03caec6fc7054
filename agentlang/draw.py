"""Draw a dependency graph with matplotlib (no graphviz needed): PNG, SVG or PDF.

Layout: one column per stream (forks side by side, children right of their parent), rows by
longest-path depth so every edge points downward; argument nodes sit in a column on the left.
"""

from __future__ import annotations

from pathlib import Path

from agentlang.graph import KIND_COLORS, Graph

FORMATS = (".png", ".svg", ".pdf")
COLORS = {**KIND_COLORS, "role_begin": "#f5f5f5", "role_end": "#f5f5f5"}  # roles shaded here
EDGE_STYLE = {"seq": ("#555555", "-", 1.0), "data": ("#1f5fbf", "--", 1.0),
              "fork": ("#c0392b", "-", 2.0), "join": ("#c0392b", "-", 2.0)}


def layout(graph: Graph) -> dict[int, tuple[float, float]]:
    """(x, y) per node id: x = stream column (+ argument column), y = −depth."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(n.id for n in graph.nodes)
    g.add_edges_from((e.src, e.dst) for e in graph.edges)
    depth: dict[int, int] = {}
    for nid in nx.topological_sort(g):
        preds = list(g.predecessors(nid))
        depth[nid] = 1 + max((depth[p] for p in preds), default=-1)
    columns: dict[int, float] = {}
    for stream in sorted(graph.stream_parent):  # children after parents, so they sit right
        columns[stream] = float(len(columns))
    has_args = any(n.stream is None for n in graph.nodes)
    pos = {}
    for n in graph.nodes:
        x = -1.0 if n.stream is None else columns[n.stream]
        pos[n.id] = ((x + (1.0 if has_args else 0.0)) * 3.2, -float(depth[n.id]))
    return pos


def draw_graph(graph: Graph, path: str | Path) -> None:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"output must end with one of {', '.join(FORMATS)}, got {path.name!r}")
    from matplotlib.figure import Figure  # no pyplot: no global figure state, any backend

    pos = layout(graph)
    xs = [x for x, _ in pos.values()] or [0.0]
    ys = [y for _, y in pos.values()] or [0.0]
    width = max(4.0, (max(xs) - min(xs)) / 3.2 * 2.6 + 3.0)
    height = max(3.0, (max(ys) - min(ys)) * 0.55 + 1.5)
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot()
    ax.set_axis_off()
    boxes = {}
    for n in graph.nodes:
        x, y = pos[n.id]
        boxes[n.id] = ax.text(
            x, y, n.label, ha="center", va="center", fontsize=8, zorder=3,
            bbox={"boxstyle": "round,pad=0.3", "fc": COLORS.get(n.kind, "white"),
                  "ec": "#333333", "lw": 0.8})
    for e in graph.edges:  # every edge points down: bottom of source → top of target
        color, style, lw = EDGE_STYLE[e.kind]
        (x1, _), (x2, _) = pos[e.src], pos[e.dst]
        rad = 0.0 if x1 == x2 or e.kind in ("fork", "join") else 0.15
        ax.annotate("", xy=(0.5, 1.0), xycoords=boxes[e.dst], xytext=(0.5, 0.0),
                    textcoords=boxes[e.src], zorder=2, arrowprops={
                        "arrowstyle": "-|>", "mutation_scale": 10, "color": color,
                        "linestyle": style, "lw": lw, "shrinkA": 4, "shrinkB": 5,
                        "connectionstyle": f"arc3,rad={rad}"})
    ax.set_xlim(min(xs) - 1.8, max(xs) + 1.8)
    ax.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
    ax.set_title(f"{graph.name}" + (f"  (truncated: {graph.truncated[:60]})"
                                    if graph.truncated else ""), fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix[1:].lower(), dpi=130)
