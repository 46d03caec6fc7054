"""The primitives programs are written with (SGLang's names and semantics, plus tools)."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any

from agentlang.choices import ChoicesMethod, token_length_normalized
from agentlang.ir import (AgentLoop, Concat, RoleBegin, RoleEnd, Select, SeparateReasoning,
                          ToolCall, as_expr, check_name, concat, leaves)
from agentlang.ir import Gen as _Gen
from agentlang.sampling import make_options
from agentlang.tools import Tool


class _DefaultBackend:
    """Holder of the process-wide default backend — the one global the SGLang-compatible
    ``set_default_backend`` API requires."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backend: Any = None

    def set(self, backend: Any) -> None:
        with self._lock:
            self._backend = backend

    def get(self) -> Any:
        with self._lock:
            return self._backend


_DEFAULT_BACKEND = _DefaultBackend()


def set_default_backend(backend: Any) -> None:
    """Backend used by ``run``/``run_batch``/``arun``/``trace`` when none is passed."""
    from agentlang.backends.base import Backend

    if backend is not None and not isinstance(backend, Backend):
        raise ValueError(f"set_default_backend needs an agentlang backend (Runtime, "
                         f"RuntimeEndpoint, OpenAI, Mock), got {type(backend).__name__}")
    _DEFAULT_BACKEND.set(backend)


def get_default_backend() -> Any:
    return _DEFAULT_BACKEND.get()


class GlobalConfig:
    """SGLang's ``global_config`` object, as far as programs read or set it:
    ``default_backend`` is the same backend ``set_default_backend`` sets. Holds no state of
    its own."""

    @property
    def default_backend(self) -> Any:
        return get_default_backend()

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        set_default_backend(backend)


global_config = GlobalConfig()

# Whether the running code is the body of a program being run or traced: there a program
# call composes into the caller's state; outside it runs the program (SGLang's semantics).
# A context variable, so each thread (and each program body) sees its own value.
# Its value: False outside; True while tracing; while running, the run's (backend, defaults),
# which a program called there and used as a value runs with.
_IN_PROGRAM: contextvars.ContextVar[Any] = contextvars.ContextVar("agentlang_in_program",
                                                                 default=False)


@contextlib.contextmanager
def program_body(run: tuple | None = None) -> Iterator[None]:
    """Marks the code inside as a program body (see :func:`in_program`); ``run`` is the
    running program's ``(backend, defaults)`` (``None`` while tracing)."""
    token = _IN_PROGRAM.set(run if run is not None else True)
    try:
        yield
    finally:
        _IN_PROGRAM.reset(token)


def in_program() -> bool:
    return _IN_PROGRAM.get() is not False


def running_program() -> tuple | None:
    """The ``(backend, defaults)`` of the program running here (None outside or tracing)."""
    v = _IN_PROGRAM.get()
    return v if isinstance(v, tuple) else None


def function(func: Callable | None = None) -> Any:
    """Decorator: ``@function`` turns ``def prog(s, ...)`` into a runnable ``Program``."""
    from agentlang.program import Program

    if func is None:
        return lambda f: Program(f)
    return Program(func)


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None,
        stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
        temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
        min_p: float | None = None, frequency_penalty: float | None = None,
        presence_penalty: float | None = None, ignore_eos: bool | None = None,
        return_logprob: bool | None = None, top_logprobs_num: int | None = None,
        dtype: type | str | None = None, regex: str | None = None, json_schema: Any = None,
        choices: list[str] | None = None, choices_method: ChoicesMethod | None = None,
        grammar: str | None = None, seed: int | None = None,
        repetition_penalty: float | None = None) -> Any:
    """Generate text at this point; ``name`` stores it as a variable. ``choices`` makes it a
    ``select`` (SGLang semantics). ``json_schema`` takes a dict, a JSON string or a pydantic
    class; ``grammar`` a Lark grammar."""
    check_name(name, "gen")
    if choices is not None:
        return select(name, choices, temperature or 0.0,
                      choices_method or token_length_normalized)
    return _Gen(name, make_options(
        max_tokens=max_tokens, min_tokens=min_tokens, stop=stop, stop_token_ids=stop_token_ids,
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty, ignore_eos=ignore_eos, seed=seed,
        return_logprob=return_logprob, top_logprobs_num=top_logprobs_num, dtype=dtype,
        regex=regex, json_schema=json_schema, grammar=grammar))


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Any:
    """An integer (the variable holds an ``int``)."""
    return gen(name, max_tokens=max_tokens, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Any:
    """A quoted string literal (the variable holds the unquoted ``str``)."""
    return gen(name, max_tokens=max_tokens, dtype=str, **kwargs)


def select(name: str | None = None, choices: list[str] | None = None, temperature: float = 0.0,
           choices_method: ChoicesMethod = token_length_normalized) -> Select:
    """Pick one of ``choices`` by log-probability given the text so far."""
    check_name(name, "select")
    if not choices:
        raise ValueError(f"select({name!r}) needs a non-empty list of choices")
    if not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"select({name!r}) choices must be non-empty strings, got {choices!r}")
    if len(set(choices)) != len(choices):
        raise ValueError(f"select({name!r}) choices contain duplicates: {choices!r}")
    if temperature < 0:
        raise ValueError(f"select temperature must be >= 0, got {temperature}")
    if not isinstance(choices_method, ChoicesMethod):
        raise ValueError("choices_method must be token_length_normalized, "
                         "greedy_token_selection or unconditional_likelihood_normalized")
    return Select(name, tuple(choices), float(temperature), choices_method)


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> Any:
    """``expr``'s named gens and selects, each followed by the split of its reasoning block
    (SGLang's ``separate_reasoning``): after ``gen("a")``, ``a`` holds the answer and
    ``a_reasoning_content`` the block (``""`` without one); the block is dropped from the
    state's text, so later calls see the answer only. ``model_type``: SGLang's parser name
    (``qwen3``, ``qwen3-thinking``, ``deepseek-r1``, ...; default ``qwen3``)."""
    from agentlang.runtime.chat.reasoning import MODEL_TYPES

    model_type = model_type or "qwen3"
    if model_type not in MODEL_TYPES:
        raise ValueError(f"separate_reasoning model_type {model_type!r}: accepted "
                         f"{', '.join(MODEL_TYPES)}")
    expr = as_expr(expr if expr is not None else "")
    names = [leaf.name for leaf in leaves(expr) if isinstance(leaf, (_Gen, Select)) and leaf.name]
    if not names:
        raise ValueError("separate_reasoning needs a named gen or select, e.g. "
                         "separate_reasoning(gen('answer'), model_type='qwen3')")
    out = expr
    for n in names:
        out = concat(out, SeparateReasoning(n, model_type))
    return out


def _role(role: str, expr: Any) -> Concat:
    if expr is None:
        return Concat((RoleBegin(role), RoleEnd(role)))
    return RoleBegin(role) + as_expr(expr) + RoleEnd(role)


def system(expr: Any = None) -> Concat:
    return _role("system", expr)


def user(expr: Any = None) -> Concat:
    return _role("user", expr)


def assistant(expr: Any = None) -> Concat:
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")


def _tools(tools: Tool | list[Tool] | tuple[Tool, ...]) -> tuple[Tool, ...]:
    items = (tools,) if isinstance(tools, Tool) else tuple(tools)
    if not items or not all(isinstance(t, Tool) for t in items):
        raise ValueError("tools must be one or more functions decorated with @agentlang.tool")
    names = [t.name for t in items]
    if len(set(names)) != len(names):
        raise ValueError(f"tool names must be unique, got {names}")
    return items


def tool_call(tools: Tool | list[Tool], name: str | None = None, max_tokens: int = 256,
              temperature: float | None = None) -> ToolCall:
    """Generate ``{"name": ..., "arguments": {...}}`` under the tools' schema, run the tool;
    the variable ``name`` holds its return value (meta info: tool, arguments, call text)."""
    check_name(name, "tool_call")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    return ToolCall(_tools(tools), name, max_tokens, temperature)


def agent_loop(tools: Tool | list[Tool], name: str = "answer", max_steps: int = 5,
               result_role: str = "user", result_prefix: str = "Tool result: ",
               answer_schema: Any = None, max_tokens: int = 256,
               temperature: float | None = None) -> AgentLoop:
    """Assistant turns that call tools, each result fed back in a ``result_role`` turn, until
    the model answers (``final_answer``) or ``max_steps`` turns; the answer goes to ``name``
    and the steps to ``get_meta_info(name)["steps"]``."""
    check_name(name, "agent_loop")
    if name is None:
        raise ValueError("agent_loop needs a variable name for the answer")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if answer_schema is not None and not isinstance(answer_schema, dict):
        raise ValueError("answer_schema must be a JSON schema dict")
    return AgentLoop(_tools(tools), name, max_steps, result_role, result_prefix, answer_schema,
                     max_tokens, temperature)
