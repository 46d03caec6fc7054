"""IR of agentlang programs: small frozen dataclass nodes; ``a + b`` concatenates.

A program appends expressions to its state (``s += "Q: " + gen("a")``). Every expression is
one of the nodes below. ``Concat`` flattens, so ``a + b + c`` is one ``Concat`` of three
leaves. Nodes are immutable: the interpreter and the tracer read them, nothing mutates them.

``Argument`` and ``Variable`` only exist while tracing: they stand for a program argument
and for a generated variable whose value is not known yet. Using one where a concrete value
is needed (an f-string, ``str()``, ``if``) raises ``TraceError`` explaining how to write it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from agentlang.sampling import SamplingOptions
# SGLang's regex constants (same values, so ported programs keep their constraints).
from agentlang.runtime.core.typed_values import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR  # noqa: F401

if TYPE_CHECKING:
    from agentlang.choices import ChoicesMethod
    from agentlang.tools import Tool



class TraceError(ValueError):
    """A program did something during tracing that a trace cannot represent."""


class Expr:
    """Base of every IR node. ``+`` builds a flattened ``Concat``.

    A node a program appends to its state (a leaf) names its ``kind``: the kind of its node in
    the traced graph and, through :func:`handler`, the method each pass runs on it
    (``Interpreter.visit_<kind>``, ``TraceStream.trace_<kind>``, the state's optional
    ``_check_<kind>``). A new leaf is a class with a ``kind`` and those methods; a pass that
    lacks its method fails with ``TypeError`` (and ``tests/frontend/test_node_dispatch.py``
    lists every leaf against every pass)."""

    kind: ClassVar[str | None] = None

    def __add__(self, other: Any) -> Concat:
        return concat(self, other)

    def __radd__(self, other: Any) -> Concat:
        return concat(other, self)


@dataclass(frozen=True)
class Text(Expr):
    kind: ClassVar[str] = "text"
    value: str


@dataclass(frozen=True)
class Concat(Expr):
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Gen(Expr):
    kind: ClassVar[str] = "gen"
    name: str | None
    options: SamplingOptions


@dataclass(frozen=True)
class Select(Expr):
    kind: ClassVar[str] = "select"
    name: str | None
    choices: tuple[str, ...]
    temperature: float
    method: ChoicesMethod


@dataclass(frozen=True)
class RoleBegin(Expr):
    kind: ClassVar[str] = "role_begin"
    role: str


@dataclass(frozen=True)
class RoleEnd(Expr):
    kind: ClassVar[str] = "role_end"
    role: str


@dataclass(frozen=True)
class VarScopeBegin(Expr):
    kind: ClassVar[str] = "var_scope_begin"
    name: str


@dataclass(frozen=True)
class VarScopeEnd(Expr):
    kind: ClassVar[str] = "var_scope_end"
    name: str


@dataclass(frozen=True)
class ToolCall(Expr):
    """Generate a call (tool name + arguments under the tool's JSON schema), run it.

    The generated call text is appended; the variable ``name`` receives the tool's return value.
    """

    kind: ClassVar[str] = "tool_call"

    tools: tuple[Tool, ...]
    name: str | None
    max_tokens: int
    temperature: float | None


@dataclass(frozen=True)
class AgentLoop(Expr):
    """Alternate assistant tool calls and fed-back results until a final answer (or max_steps)."""

    kind: ClassVar[str] = "agent_loop"

    tools: tuple[Tool, ...]
    name: str
    max_steps: int
    result_role: str
    result_prefix: str
    answer_schema: Any
    max_tokens: int
    temperature: float | None


@dataclass(frozen=True)
class SeparateReasoning(Expr):
    """Split variable ``name`` (a finished gen) into its reasoning block and its answer:
    ``name`` keeps the answer (in the state's text too), ``name + "_reasoning_content"`` the
    block (SGLang's ``separate_reasoning``; ``model_type`` one of its parser names)."""

    kind: ClassVar[str] = "separate_reasoning"

    name: str
    model_type: str

    @property
    def reasoning_name(self) -> str:
        return f"{self.name}_reasoning_content"


@dataclass(frozen=True)
class Call(Expr):
    """Call another program inline on the same state: ``s += other(x=1)``."""

    program: Any
    args: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Fork(Expr):
    """Graph node: the stream splits into ``size`` child streams sharing its text."""

    size: int


@dataclass(frozen=True)
class Join(Expr):
    """Graph node: child streams merge back (``gather_variable`` or ``concate_and_append``)."""

    mode: str


class Placeholder(Expr):
    """Base of the tracing placeholders: every use that needs a concrete value raises the
    subclass's ``_misuse`` error, which explains how to write the line instead."""

    def _misuse(self, what: str) -> TraceError:
        """The error for using this placeholder in ``what``; subclasses say how to fix it."""
        return TraceError(f"{type(self).__name__}: a traced placeholder has no value yet, so "
                          f"it cannot be used in {what}")

    def __str__(self) -> str:
        raise self._misuse("str()")

    def __format__(self, spec: str) -> str:
        raise self._misuse("an f-string or format()")

    def __bool__(self) -> bool:
        raise self._misuse("a condition (if/while/and/or)")

    def __iter__(self):
        raise self._misuse("a loop or unpacking")

    def __len__(self) -> int:
        raise self._misuse("len()")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise self._misuse(f"an attribute access (.{attr})")


@dataclass(frozen=True, eq=False)
class Argument(Placeholder):
    """Placeholder for a program argument during tracing."""

    name: str

    def _misuse(self, what: str) -> TraceError:
        return TraceError(
            f"argument '{self.name}' was used in {what} while tracing; during tracing arguments "
            f"are placeholders without a value. Concatenate it instead of formatting it: write "
            f"s += \"...\" + {self.name} + \"...\" rather than s += f\"...{{{self.name}}}...\", "
            f"or pass a concrete value: program.trace({self.name}=...)"
        )

    def __getitem__(self, key: Any) -> Any:
        raise self._misuse("an index or key lookup")


@dataclass(frozen=True, eq=False)
class Variable(Placeholder):
    """Placeholder for a generated variable during tracing (``s["name"]``)."""

    name: str
    writer: int | None  # graph node id that wrote it; None: never written in this trace

    def _misuse(self, what: str) -> TraceError:
        return TraceError(
            f"generated variable '{self.name}' was used in {what} while tracing; its value is "
            f"only known when the program runs. Append it with s += \"...\" + s[\"{self.name}\"]; "
            f"code that branches on or formats generated text cannot be traced"
        )

    def __eq__(self, other: object) -> Any:  # type: ignore[override]
        return _Undecidable(self._misuse("a comparison"))

    def __ne__(self, other: object) -> Any:  # type: ignore[override]
        return _Undecidable(self._misuse("a comparison"))

    __hash__ = object.__hash__

    def __int__(self) -> int:
        raise self._misuse("int()")

    def __float__(self) -> float:
        raise self._misuse("float()")


@dataclass(frozen=True)
class _Undecidable:
    error: TraceError = field()

    def __bool__(self) -> bool:
        raise self.error


def as_expr(value: Any) -> Expr:
    """Coerce what a program may append: str, numbers (as text) and IR nodes."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Text(str(value))
    raise TypeError(
        f"cannot append a {type(value).__name__} to a program state; append str or agentlang "
        f"expressions (convert with str(...) or json.dumps(...))"
    )


def handler(owner: object, prefix: str, node: Any, optional: bool = False) -> Callable | None:
    """``owner``'s method for ``node``: ``<prefix><kind>`` (the one dispatch of every pass over
    the IR). A missing method is a ``TypeError`` naming it, or ``None`` when ``optional``."""
    kind = getattr(type(node), "kind", None)
    method = getattr(owner, prefix + kind, None) if kind is not None else None
    if method is None and not optional:
        raise TypeError(f"{type(owner).__name__} cannot handle a {type(node).__name__} node "
                        f"(it has no {prefix}{kind or '<kind>'} method)")
    return method


def leaf_kinds() -> dict[str, type[Expr]]:
    """Every leaf node class (an ``Expr`` subclass naming a ``kind``), by kind."""
    found: dict[str, type[Expr]] = {}
    todo = list(Expr.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__dict__.get("kind") is not None:
            found[cls.kind] = cls
    return found


def leaves(expr: Expr) -> tuple[Expr, ...]:
    """The non-Concat nodes of ``expr`` in order."""
    return expr.items if isinstance(expr, Concat) else (expr,)


def written_name(node: Expr) -> str | None:
    """The variable a leaf node writes, if any."""
    if isinstance(node, (Gen, Select, ToolCall, AgentLoop, VarScopeEnd)):
        return node.name
    if isinstance(node, SeparateReasoning):
        return node.reasoning_name
    return None


def concat(a: Any, b: Any) -> Concat:
    """``a + b`` for IR nodes; rejects writing one variable twice in one expression."""
    items = leaves(as_expr(a)) + leaves(as_expr(b))
    seen: set[str] = set()
    for node in items:
        name = written_name(node)
        if name is None:
            continue
        if name in seen:
            raise ValueError(
                f"variable name '{name}' is written twice in one expression; the second write "
                f"would overwrite the first before it can be read — use two different names"
            )
        seen.add(name)
    return Concat(items)


def check_name(name: Any, what: str) -> None:
    """Validate a variable name given to gen/select/var_scope/tool_call."""
    if name is None:
        return
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty str, got {name!r}")
