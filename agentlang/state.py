"""The program state ``s`` and fork groups, shared by running and tracing.

``ProgramState`` is a thin front over a *stream*: a ``StreamExecutor`` when the program runs,
a ``TraceStream`` when it is traced. It checks, at the line where the program makes the
mistake, what can be checked without a model: role nesting, var scopes, writing a variable
inside a var_scope of the same name, appending to a fork after its join, joining twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agentlang.ir import (AgentLoop, Call, Concat, Expr, Fork, Join, RoleBegin, RoleEnd,
                          VarScopeBegin, VarScopeEnd, as_expr, check_name, handler,
                          leaves, written_name)

JOIN_MODES = ("gather_variable", "concate_and_append")


class Closing:
    """Shared by the states of one fork group: once ``reason`` is set (at the join), appending
    to any of them raises ``ValueError(reason)``."""

    def __init__(self) -> None:
        self.reason: str | None = None


class ProgramState:
    """What a program function receives as ``s``."""

    def __init__(self, stream: Any, open_role: str | None = None,
                 open_scopes: tuple[str, ...] = (), closing: Closing | None = None):
        self._stream = stream
        self._open_role = open_role
        self._open_scopes = list(open_scopes)
        self._closing = closing if closing is not None else Closing()
        self.ret_value: Any = None

    # -- appending ---------------------------------------------------------------------
    def __iadd__(self, other: Any) -> ProgramState:
        if other is None:
            raise ValueError("cannot append None to a program state")
        self._check_open()
        pending: list[Expr] = []
        for leaf in leaves(as_expr(other)):
            if isinstance(leaf, Call):
                self._flush(pending)
                leaf.program.call_inline(self, dict(leaf.args))
                continue
            self._check_leaf(leaf)
            pending.append(leaf)
        self._flush(pending)
        return self

    def _flush(self, pending: list[Expr]) -> None:
        if pending:
            self._stream.submit(pending[0] if len(pending) == 1 else Concat(tuple(pending)))
            pending.clear()

    def _check_open(self) -> None:
        if self._closing.reason is not None:
            raise ValueError(self._closing.reason)

    def _check_leaf(self, leaf: Expr) -> None:
        if isinstance(leaf, (Fork, Join)):
            raise ValueError("fork/join are not appended; use forks = s.fork(n) and forks.join()")
        name = written_name(leaf)
        if name is not None and name in self._open_scopes and not isinstance(leaf, VarScopeEnd):
            raise ValueError(f"{type(leaf).__name__.lower()} writes variable '{name}' inside "
                             f"var_scope('{name}'), which will overwrite it when the scope "
                             f"ends; use another name")
        check = handler(self, "_check_", leaf, optional=True)   # the passes' one dispatch
        if check is not None:
            check(leaf)

    def _check_role_begin(self, leaf: RoleBegin) -> None:
        if self._open_role is not None:
            raise ValueError(f"role '{leaf.role}' begins while role '{self._open_role}' is "
                             f"open; roles do not nest — end '{self._open_role}' first")
        self._open_role = leaf.role

    def _check_role_end(self, leaf: RoleEnd) -> None:
        if self._open_role != leaf.role:
            raise ValueError(f"role '{leaf.role}' ends but the open role is "
                             f"{self._open_role!r}")
        self._open_role = None

    def _check_var_scope_begin(self, leaf: VarScopeBegin) -> None:
        if leaf.name in self._open_scopes:
            raise ValueError(f"var_scope('{leaf.name}') is already open")
        self._open_scopes.append(leaf.name)

    def _check_var_scope_end(self, leaf: VarScopeEnd) -> None:
        if leaf.name not in self._open_scopes:
            raise ValueError(f"var_scope('{leaf.name}') ends but was never opened")
        self._open_scopes.remove(leaf.name)

    def _check_agent_loop(self, leaf: AgentLoop) -> None:
        if self._open_role is not None:
            raise ValueError(f"agent_loop opens its own roles; end role '{self._open_role}' "
                             f"before it")

    # -- roles and scopes ----------------------------------------------------------------
    def _role(self, role: str, expr: Any) -> Any:
        if expr is not None:
            self += RoleBegin(role) + as_expr(expr) + RoleEnd(role)
            return None

        @contextmanager
        def scope() -> Iterator[None]:
            self.__iadd__(RoleBegin(role))
            yield
            self.__iadd__(RoleEnd(role))

        return scope()

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Text appended inside the block becomes variable ``name``."""
        check_name(name, "var_scope")
        self += VarScopeBegin(name)
        yield
        self += VarScopeEnd(name)

    # -- fork / join -------------------------------------------------------------------
    def fork(self, size: int = 1, position_ids_offset: list[int] | None = None) -> ForkGroup:
        """``size`` copies of this state that continue independently (and concurrently).
        ``position_ids_offset`` (SGLang's signature: one position offset per branch) is
        checked and not used: every branch's tokens sit at their true positions after the
        shared prefix, whose KV the branches share through the radix cache."""
        self._check_open()
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"fork size must be a positive int, got {size!r}")
        if position_ids_offset is not None and not (
                isinstance(position_ids_offset, (list, tuple))
                and len(position_ids_offset) == size
                and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0
                        for o in position_ids_offset)):
            raise ValueError(f"position_ids_offset: must be None or {size} integers >= 0 (one "
                             f"per branch), got {position_ids_offset!r}")
        streams, token = self._stream.fork_streams(size)
        closing = Closing()
        states = [ProgramState(st, self._open_role, tuple(self._open_scopes), closing)
                  for st in streams]
        return ForkGroup(states, closing, self._check_open,
                         lambda mode: self._stream.join_streams(token, streams, mode))

    @contextmanager
    def copy(self) -> Iterator[ProgramState]:
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    # -- reading -----------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        return self._stream.get_var(name)

    def get_var(self, name: str) -> Any:
        return self._stream.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        check_name(name, "variable")
        self._stream.set_var(name, value)

    set_var = __setitem__

    def __contains__(self, name: str) -> bool:
        return self._stream.has_var(name)

    def get_meta_info(self, name: str) -> Any:
        return self._stream.get_meta_info(name)

    def text(self) -> str:
        return self._stream.text()

    def messages(self) -> list[dict]:
        return self._stream.messages()

    def sync(self) -> None:
        self._stream.sync()

    def error(self) -> BaseException | None:
        """The error that stopped this stream, if any (without raising it)."""
        try:
            self._stream.sync()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def text_iter(self, var_name: str | None = None, *, name: str | None = None
                  ) -> Iterator[str]:
        """Yield the text (or variable ``var_name``/``name``) as it is generated with
        ``run(stream=True)``; without streaming, all of it at once."""
        return self._stream.iter_text(var_name if var_name is not None else name)

    async def text_async_iter(self, var_name: str | None = None, *, name: str | None = None
                              ) -> AsyncIterator[str]:
        it = self._stream.iter_text(var_name if var_name is not None else name)
        done = object()
        while True:
            chunk = await asyncio.to_thread(next, it, done)
            if chunk is done:
                return
            yield chunk

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ForkGroup:
    """The states returned by ``s.fork(n)``. ``forks += x`` appends to every fork
    (``x`` may also be a list with one item per fork, or ``lambda i: ...``)."""

    def __init__(self, states: list[ProgramState], closing: Closing,
                 check_parent: Callable[[], None], merge: Callable[[str], None]):
        self.states = states
        self._closing = closing             # the states' shared closing
        self._check_parent = check_parent   # raises if the parent state is closed
        self._merge = merge                 # merges the forks' streams into the parent's
        self._joined = False

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        if value is not self.states[i]:
            raise ValueError("fork states cannot be replaced; append with forks[i] += ...")

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ForkGroup:
        if self._joined:
            raise ValueError("this fork group was joined; append to the parent state instead")
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"appending a list to {len(self.states)} forks needs "
                                 f"{len(self.states)} items, got {len(other)}")
            for state, item in zip(self.states, other):
                state += item
        elif callable(other) and not isinstance(other, Expr):
            fn: Callable[[int], Any] = other
            for i, state in enumerate(self.states):
                state += fn(i)
        else:
            for state in self.states:
                state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Merge the forks into the parent: ``gather_variable`` sets each variable written in
        the forks to the list of the forks' values; ``concate_and_append`` appends each
        fork's new text to the parent. The forks' shared prefix is released here."""
        if self._joined:
            raise ValueError("this fork group was already joined; join() may be called once")
        if mode not in JOIN_MODES:
            raise ValueError(f"join mode must be one of {JOIN_MODES}, got {mode!r}")
        self._check_parent()
        self._joined = True
        self._closing.reason = "this fork was joined; append to the parent state instead"
        self._merge(mode)
