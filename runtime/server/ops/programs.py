"""Fork/join graphs of DSL programs run through this server, for the dashboard.

A client may tag a ``/generate`` request with an optional top-level ``program`` object (SGLang's
server ignores unknown top-level fields; it never goes inside ``sampling_params``)::

    {"id": "3f2a…", "name": "pros_and_cons", "branch": "0/1.2", "parent": "0/1", "after": 2}

``id`` names one run; ``branch`` one stream of it (the root stream, or a fork child);
``parent`` is the stream it was forked from (absent for the root) and ``after`` how many
generations the parent had made when it forked. Each tagged request is one node of the run's
graph: edges go along a branch (``seq``), from the parent's last generation before the fork to
a child's first (``fork``), and from a child's last generation to the parent's first one after
the fork (``join``). The tracker keeps the last :data:`MAX_PROGRAMS` runs.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentlang.runtime.server.errors import bad_request

MAX_PROGRAMS = 16
MAX_NODES = 512          # generations kept per run
MAX_TEXT = 256


@dataclass
class _Gen:
    branch: str
    step: int                      # index of this generation within its branch
    rids: tuple[str, ...]          # engine request ids


@dataclass
class _Run:
    name: str
    gens: list[_Gen] = field(default_factory=list)
    forks: dict[str, tuple[str | None, int]] = field(default_factory=dict)  # branch -> (parent, after)
    steps: dict[str, int] = field(default_factory=dict)                     # branch -> gens so far


def _text(tag: dict, key: str, required: bool) -> str | None:
    v = tag.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not 0 < len(v) <= MAX_TEXT:
        raise bad_request(f"program.{key}: must be a non-empty string of at most {MAX_TEXT} "
                          "characters", f"program.{key}")
    return v


def parse_tag(tag: Any) -> tuple[str, str, str, str | None, int]:
    """Validate a ``program`` tag: (id, name, branch, parent, after); 400 naming the field."""
    if not isinstance(tag, dict):
        raise bad_request("program: must be an object with id and branch", "program")
    pid, branch = _text(tag, "id", True), _text(tag, "branch", True)
    name = _text(tag, "name", False) or "program"
    parent = _text(tag, "parent", False)
    after = tag.get("after", 0)
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise bad_request("program.after: must be an integer >= 0", "program.after")
    return pid, name, branch, parent, after


class ProgramTracker:
    """Runs seen recently, oldest dropped first. Touched only from the event loop."""

    def __init__(self) -> None:
        self.runs: OrderedDict[str, _Run] = OrderedDict()

    def record(self, tag: Any, rids: list[str]) -> None:
        """Add one generation of a tagged request (validated by :func:`parse_tag`)."""
        pid, name, branch, parent, after = parse_tag(tag)
        run = self.runs.get(pid)
        if run is None:
            run = self.runs[pid] = _Run(name)
            while len(self.runs) > MAX_PROGRAMS:
                self.runs.popitem(last=False)
        self.runs.move_to_end(pid)
        if len(run.gens) >= MAX_NODES:
            return
        run.forks.setdefault(branch, (parent, after))
        step = run.steps.get(branch, 0)
        run.steps[branch] = step + 1
        run.gens.append(_Gen(branch, step, tuple(rids)))

    def graphs(self, running: set[str], waiting: set[str]) -> list[dict]:
        """Every run as ``{"id", "name", "nodes", "edges", "active"}``; a node's ``state`` is
        ``"decoding"`` while one of its requests runs, ``"waiting"``, or ``"done"``."""
        return [_graph(pid, run, running, waiting) for pid, run in reversed(self.runs.items())]


def _graph(pid: str, run: _Run, running: set[str], waiting: set[str]) -> dict:
    by_key = {(g.branch, g.step): i for i, g in enumerate(run.gens)}
    nodes, edges = [], []
    for i, g in enumerate(run.gens):
        state = "decoding" if running.intersection(g.rids) else \
            "waiting" if waiting.intersection(g.rids) else "done"
        nodes.append({"id": i, "branch": g.branch, "step": g.step, "state": state})
        if g.step > 0:
            edges.append([by_key[(g.branch, g.step - 1)], i, "seq"])
            continue
        src = _fork_source(run, g.branch, i)
        if src is not None:
            edges.append([src, i, "fork"])
    for branch, (parent, after) in run.forks.items():
        last = by_key.get((branch, run.steps[branch] - 1))
        dst = by_key.get((parent, after)) if parent is not None else None
        if last is not None and dst is not None:
            edges.append([last, dst, "join"])
    active = sorted({n["branch"] for n in nodes if n["state"] == "decoding"})
    return {"id": pid, "name": run.name, "nodes": nodes, "edges": edges, "active": active}


def _fork_source(run: _Run, branch: str, before: int) -> int | None:
    """The generation that the first one of ``branch`` (arrived ``before``-th) follows: the
    parent's last generation before the fork; when the parent made none (or never generated
    at all, so the server does not know its fork point), that of the nearest ancestor, by
    arrival. Branch paths name their ancestors (``"0/1.2"`` hangs from ``"0"``)."""
    parent, after = run.forks.get(branch, (None, 0))
    while parent is not None:
        for i in range(before - 1, -1, -1):
            g = run.gens[i]
            if g.branch == parent and (after is None or g.step < after):
                return i
        grand = run.forks.get(parent)
        parent, after = grand if grand is not None else (_path_parent(parent), None)
    return None


def _path_parent(branch: str) -> str | None:
    return branch.rsplit("/", 1)[0] if "/" in branch else None
