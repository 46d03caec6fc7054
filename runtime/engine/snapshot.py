"""One consistent, cheap copy of what a live view shows: metrics, the radix tree (bounded),
page reference counts, requests and recent evictions.

:meth:`StepCore.snapshot <agentlang.runtime.engine.step_core.StepCore.snapshot>` runs under
the engine's step lock (``Engine.snapshot``), so it only *copies*:
the tree walk is bounded by ``max_nodes`` and the page map is a refcount list copy; turning
them into page states and text happens afterwards, off the engine thread
(:func:`page_map`). ``cost_ms`` is the time the lock was held: the engine-thread cost.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

from agentlang.runtime.cache.snapshot import TreeSnapshot
from agentlang.runtime.cache.page_allocator import PageStates, page_states
from agentlang.runtime.cache.radix_cache import Eviction
from agentlang.runtime.request.request import RequestRow

MAX_SNAPSHOT_NODES = 20000


class EngineSnapshot(NamedTuple):
    time: float                        # time.time() when taken
    metrics: dict[str, float]          # Engine.metrics() at that moment
    tree: TreeSnapshot | None          # None when asked for max_nodes == 0
    refcounts: list[int] | None        # per page; None when pages=False
    tree_pages: frozenset[int] | None  # pages the tree owns; None when pages=False
    requests: list[RequestRow]
    evictions: list[Eviction]
    page_size: int
    cost_ms: float                     # engine-thread time spent taking it
    sessions: tuple = ()               # SessionRow per open session (engine.sessions)


def check_max_nodes(max_nodes: object) -> int:
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) \
            or not 0 <= max_nodes <= MAX_SNAPSHOT_NODES:
        raise ValueError(f"max_nodes: must be an integer in [0, {MAX_SNAPSHOT_NODES}], "
                         f"got {max_nodes!r}")
    return max_nodes


def page_map(snap: EngineSnapshot) -> PageStates:
    """The snapshot's page states (computed outside the lock)."""
    if snap.refcounts is None:
        raise ValueError("page_map: the snapshot was taken with pages=False")
    return page_states(snap.refcounts, snap.tree_pages)


def namespace_label(namespace: Hashable) -> dict[str, str]:
    """Readable parts of an engine namespace ``(model, dtype, kv_dtype[, salt])``. The tenant
    salt is shown only as a short hash."""
    import hashlib

    if not isinstance(namespace, tuple) or len(namespace) < 3:
        return {"name": str(namespace)}
    out = {"model": str(namespace[0]), "dtype": str(namespace[1]), "kv": str(namespace[2])}
    if len(namespace) > 3:
        out["salt"] = hashlib.sha256(str(namespace[3]).encode()).hexdigest()[:8]
    return out
