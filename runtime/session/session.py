"""One session: a tree of turns (SGLang's ``session_params`` semantics) and its limits.

A turn is one request of the session, keyed by its request id. A turn may continue another,
finished one (``session_params.rid``): its prompt is that turn's prompt plus its output (or the
prompt alone with ``drop_previous_output``), cut at ``offset`` tokens when one is given, then
the new input (its leading BOS dropped). ``replace`` first removes the continued turn's
children (aborting the running ones); ``replace`` without ``rid`` removes every turn. A turn
without ``rid`` starts from its own input alone. These are SGLang 0.5.23's rules; where SGLang
silently slices or aborts, agentlang refuses with :class:`SessionError` naming the field (an
``offset`` beyond the history, continuing or replacing a turn that has not finished).

``capacity`` bounds a turn's context in tokens: its assembled prompt plus ``max_tokens``
(SGLang names it ``capacity_of_str_len``; agentlang counts tokens). ``timeout``: seconds
without a new turn after which the session closes itself (``None``: never).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field


class SessionError(ValueError):
    """A session request that cannot be served; ``field`` names the offending field."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.status = status


@dataclass(frozen=True)
class TurnParams:
    """SGLang's ``session_params`` (``id`` is the session's)."""

    id: str
    rid: str | None = None
    offset: int | None = None
    replace: bool = False
    drop_previous_output: bool = False


@dataclass(eq=False)
class Turn:
    rid: str
    parent: Turn | None
    prompt: list[int]
    output: list[int] | None = None          # None while the turn runs
    children: list[Turn] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.output is not None


@dataclass(eq=False)
class Session:
    id: str
    namespace: Hashable
    capacity: int                     # tokens: a turn's prompt + max_tokens
    timeout: float | None             # idle seconds until it closes itself
    last_active: float                # time.monotonic() of the latest turn
    turns: dict[str, Turn] = field(default_factory=dict)
    first_prompt: int | None = None   # tokens of its first request's prompt (left plain LRU
    #                                   when it closes: maybe shared, e.g. a system prompt)
    next_use_s: float | None = None   # a next-use hint sent while no turn had finished yet

    def assemble(self, turn: TurnParams, new_ids: list[int], max_tokens: int, rid: str,
                 bos_id: int | None) -> tuple[list[int], list[str]]:
        """The prompt of a new turn ``rid`` (registered here as running) and the request ids of
        running turns that ``replace`` removed (the caller aborts them). Nothing changes when
        it raises."""
        if rid in self.turns:
            raise SessionError("rid", f"request id {rid!r} is already a turn of this session")
        last = None
        if turn.rid is not None:
            last = self.turns.get(turn.rid)
            if last is None:
                raise SessionError("session_params.rid",
                                   f"no turn {turn.rid!r} in session {self.id!r}")
            if not last.finished:
                raise SessionError("session_params.rid", f"turn {turn.rid!r} has not finished "
                                   "(continue or replace a finished turn)")
        ids = list(new_ids)
        if last is not None:
            if ids and bos_id is not None and ids[0] == bos_id:
                ids = ids[1:]
            history = last.prompt + ([] if turn.drop_previous_output else last.output)
            if turn.offset:
                if not 0 <= turn.offset <= len(history):
                    raise SessionError("session_params.offset",
                                       f"must be in [0, {len(history)}] (the tokens of turn "
                                       f"{turn.rid!r}), got {turn.offset}")
                history = history[:turn.offset]
            ids = history + ids
        elif turn.offset:
            raise SessionError("session_params.offset", "needs session_params.rid (the turn "
                               "whose tokens it cuts)")
        if not ids:
            raise SessionError("input_ids", "a session turn needs input tokens after its "
                               "history is restored")
        if len(ids) + max_tokens > self.capacity:
            raise SessionError("session_params.id", f"the turn needs {len(ids)} prompt + "
                               f"{max_tokens} new tokens, over the session's capacity of "
                               f"{self.capacity} tokens", status=413)
        removed: list[Turn] = []
        if turn.replace:
            roots = list(last.children) if last is not None else \
                [t for t in self.turns.values() if t.parent is None]
            for t in roots:
                removed.extend(_subtree(t))
            if last is not None:
                last.children.clear()
        for t in removed:
            self.turns.pop(t.rid, None)
        node = Turn(rid, last, ids)
        if last is not None:
            last.children.append(node)
        self.turns[rid] = node
        return ids, [t.rid for t in removed if not t.finished]

    def finish(self, rid: str, output: list[int], now: float) -> None:
        """Turn ``rid`` finished with ``output`` (unknown ids: a turn ``replace`` removed)."""
        t = self.turns.get(rid)
        if t is not None:
            t.output = list(output)
        self.last_active = now

    def drop(self, rid: str) -> None:
        """Turn ``rid`` failed or was aborted before producing anything usable: forget it."""
        t = self.turns.pop(rid, None)
        if t is not None and t.parent is not None and t in t.parent.children:
            t.parent.children.remove(t)

    def idle(self, now: float) -> bool:
        return self.timeout is not None and now - self.last_active > self.timeout


def _subtree(t: Turn) -> list[Turn]:
    out, stack = [], [t]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children)
    return out
