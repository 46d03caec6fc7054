"""A picture of the radix prefix cache: one box per tree node with its token count, pages,
lock count and the start of its text; shared prefixes appear once, branches fan out."""

from __future__ import annotations

from pathlib import Path

from agentlang.runtime.cache.radix_cache import RadixCache, TreeNode


def tree_layout(root: TreeNode) -> tuple[dict[int, tuple[float, float]], list[tuple[TreeNode, TreeNode]]]:
    """Leaves spread left to right, parents centred above their children.
    Returns (x, depth) per node id and the parent→child edges."""
    pos: dict[int, tuple[float, float]] = {}
    edges: list[tuple[TreeNode, TreeNode]] = []
    next_x = [0.0]

    def place(node: TreeNode, depth: int) -> float:
        kids = sorted(node.children.values(), key=lambda n: n.key)
        if not kids:
            x = next_x[0]
            next_x[0] += 1
        else:
            xs = [place(k, depth + 1) for k in kids]
            edges.extend((node, k) for k in kids)
            x = sum(xs) / len(xs)
        pos[id(node)] = (x, depth)
        return x

    place(root, 0)
    return pos, edges


def draw_radix_tree(cache: RadixCache, path: str | Path, tokenizer=None,
                    title: str = "Radix prefix cache") -> Path:
    """Draw every namespace's tree to ``path`` (.png/.svg/.pdf) with matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roots = [r for r in cache.roots().values() if r.children]
    if not roots:
        raise ValueError("draw_radix_tree: the cache is empty")
    nodes: dict[int, TreeNode] = {}
    pos: dict[int, tuple[float, float]] = {}
    edges: list[tuple[TreeNode, TreeNode]] = []
    offset = 0.0
    for root in roots:
        p, e = tree_layout(root)
        width = max(x for x, _ in p.values()) + 1
        pos.update({k: (x + offset, d) for k, (x, d) in p.items()})
        edges += e
        stack = [root]
        while stack:
            n = stack.pop()
            nodes[id(n)] = n
            stack.extend(n.children.values())
        offset += width + 0.5
    depth = max(d for _, d in pos.values())
    fig, ax = plt.subplots(figsize=(max(6, 2.6 * offset), 1.7 * (depth + 1) + 0.6))
    for a, b in edges:
        (x0, y0), (x1, y1) = pos[id(a)], pos[id(b)]
        ax.plot([x0, x1], [-y0, -y1], color="#888", lw=1.2, zorder=1)
    for key, node in nodes.items():
        x, d = pos[key]
        if node.parent is None:
            label, color = f"namespace\n{_short(node.namespace)}", "#eeeeee"
        else:
            snippet = ""
            if tokenizer is not None:
                snippet = tokenizer.decode(list(node.key[:12])).replace("\n", " ")
                snippet = "\n" + (snippet[:22] + "…" if len(snippet) > 22 else snippet)
            label = f"{len(node.key)} tokens · {len(node.pages)} pages{snippet}"
            label += f"\nlocks {node.lock_ref}" if node.lock_ref else ""
            color = "#ffd8a8" if node.lock_ref else "#cfe3ff"
        ax.text(x, -d, label, ha="center", va="center", fontsize=7.5, zorder=2,
                bbox=dict(boxstyle="round,pad=0.35", fc=color, ec="#555"))
    ax.set_xlim(-0.8, offset - 0.2)
    ax.set_ylim(-depth - 0.6, 0.6)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _short(ns) -> str:
    text = " / ".join(str(x) for x in ns) if isinstance(ns, tuple) else str(ns)
    return text if len(text) < 40 else text[:38] + "…"
