"""A fork of a stream (``s.fork(n)``): its record and the two queue items that place it in
the parent's and the children's streams (executor.py).

``fork_streams`` returns the children at once and queues :class:`ForkStart` on the parent;
each child's first item is :class:`ForkGate`. The parent's worker, reaching the fork point,
runs :func:`start_children`: commits the parent's text once (``backend.cache_prefix``, forks of
several states), copies the parent's state into every child and opens the gate. So the program
thread never waits for a commit, and forking each state of a frontier in a loop sends their
commits together.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentlang.branch import BranchId

if TYPE_CHECKING:
    from agentlang.executor import StreamExecutor


@dataclass
class ForkRecord:
    """One ``s.fork(n)``: its child executors and the prefix handle held for them. The
    parent's worker sets ``handle`` and ``error`` (the parent's, if it failed before the fork
    point) and then ``ready``; children start running only after ``ready``."""

    children: list[StreamExecutor]
    index: int = 0                   # the parent's how-manieth fork (branch paths)
    handle: Any = None
    released: bool = False
    error: BaseException | None = None
    ready: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class ForkStart:
    """Queued on the parent: at this point of its stream, commit the prefix and start
    ``record``'s children."""

    record: ForkRecord


@dataclass(frozen=True)
class ForkGate:
    """A child's first item: wait until its parent reached the fork point."""

    record: ForkRecord


def start_children(parent: StreamExecutor, record: ForkRecord) -> None:
    """The parent's worker, at the fork point: commit the prefix (a fork of several states),
    copy the parent's state into the children, let them run. An error of the parent (before
    the fork point, or the commit's) becomes the children's."""
    try:
        if parent.error_ is None:
            backend = parent.ctx.backend
            if len(record.children) > 1 and parent.text_ and backend.capabilities.prefix_cache:
                record.handle = backend.cache_prefix(parent.text_)
    except BaseException as e:  # noqa: BLE001 - the children and the program get it
        parent.error_ = e
    record.error = parent.error_
    for i, child in enumerate(record.children):
        child.branch = BranchId(f"{parent.branch.path}/{record.index}.{i}", parent.branch.path,
                                parent.gens)
        with child.cond:
            child.text_ = parent.text_
            child.cond.notify_all()
        child.messages_ = list(parent.messages_)
        child.variables = dict(parent.variables)
        child.meta_info = dict(parent.meta_info)
        child.cur_role, child.cur_role_begin = parent.cur_role, parent.cur_role_begin
        child.scopes = dict(parent.scopes)
        child.fork_start = len(parent.text_)
        child.fork_messages = len(parent.messages_)
    record.ready.set()
