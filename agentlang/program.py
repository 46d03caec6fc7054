"""``Program``: what ``@agentlang.function`` returns — run, run_batch, arun, trace, bind."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
import re
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentlang.api import get_default_backend, in_program, program_body, running_program
from agentlang.backends.base import Backend
from agentlang.compiler import plan_batch
from agentlang.executor import RunContext, StreamExecutor
from agentlang.graph import Graph
from agentlang.ir import Call
from agentlang.sampling import RUN_OPTION_NAMES, SamplingOptions, run_defaults
from agentlang.state import ProgramState
from agentlang.tracer import trace_program


def _resolve_backend(backend: Backend | None) -> Backend:
    backend = backend if backend is not None else get_default_backend()
    if backend is None:
        raise ValueError("no backend: pass backend=... or call "
                         "agentlang.set_default_backend(agentlang.Runtime(...))")
    if not isinstance(backend, Backend):
        raise ValueError(f"backend must be an agentlang backend, got {type(backend).__name__}")
    return backend


def program_label(name: str) -> str:
    """A program name as an accounting label (agentlang.runtime.core.agent_stats: ``[A-Za-z0-9_.:/-]``,
    at most 64 characters)."""
    return re.sub(r"[^A-Za-z0-9_.:/-]", "_", name)[:64] or "program"


def _split_options(kwargs: dict[str, Any]) -> tuple[SamplingOptions, dict[str, Any]]:
    opts = {k: kwargs.pop(k) for k in RUN_OPTION_NAMES if k in kwargs}
    return run_defaults(**opts), kwargs


@dataclass(frozen=True)
class NestedCall(Call):
    """A program called inside a running program without a state (SGLang's
    ``SglFunction.__call__``): ``s += other(...)`` composes it into ``s`` like any call, and
    used as a value (``x["var"]``, ``x.text()``, …) it is a run of its own — its own state
    and its own session — started on first use (so a call that is only composed never runs
    twice) with the caller's backend and run options."""

    start: Callable[[], ProgramState] | None = field(default=None, compare=False, repr=False)
    cell: dict = field(default_factory=dict, compare=False, repr=False)
    lock: Any = field(default_factory=threading.Lock, compare=False, repr=False)

    def state(self) -> ProgramState:
        with self.lock:
            if "state" not in self.cell:
                self.cell["state"] = self.start()
            return self.cell["state"]

    def __getitem__(self, name: str) -> Any:
        return self.state()[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.state(), name)


class Program:
    """A program function ``def f(s, ...)``; the first parameter receives the state."""

    def __init__(self, func: Any, bound: dict[str, Any] | None = None):
        if not callable(func):
            raise ValueError(f"@function needs a function, got {type(func).__name__}")
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY,
                                                params[0].POSITIONAL_OR_KEYWORD):
            raise ValueError(f"program {func.__name__}: the first parameter must be the state "
                             f"(def {func.__name__}(s, ...))")
        self.func = func
        self.name = func.__name__
        self.params = params[1:]
        self.arg_names = [p.name for p in self.params]
        self.bound = dict(bound or {})
        functools.update_wrapper(self, func)

    def __repr__(self) -> str:
        return f"<agentlang program {self.name}({', '.join(self.arg_names)})>"

    # -- arguments -----------------------------------------------------------------------
    def arguments(self, args: tuple, kwargs: dict[str, Any], complete: bool = True
                  ) -> dict[str, Any]:
        """Map positional and keyword arguments to parameter names (bound ones included)."""
        if len(args) > len(self.arg_names):
            raise ValueError(f"program {self.name} takes {len(self.arg_names)} arguments "
                             f"({', '.join(self.arg_names)}), got {len(args)} positional")
        out = {**self.bound, **dict(zip(self.arg_names, args))}
        for key, value in kwargs.items():
            if key not in self.arg_names:
                raise ValueError(f"program {self.name} has no argument {key!r}; its arguments "
                                 f"are {self.arg_names} (sampling options: "
                                 f"{', '.join(RUN_OPTION_NAMES)})")
            out[key] = value
        if complete:
            missing = [p.name for p in self.params
                       if p.name not in out and p.default is inspect.Parameter.empty]
            if missing:
                raise ValueError(f"program {self.name} is missing arguments: {missing}")
        return out

    def bind(self, **kwargs: Any) -> Program:
        """A copy of this program with some arguments fixed."""
        self.arguments((), kwargs, complete=False)
        return Program(self.func, {**self.bound, **kwargs})

    # -- composition ---------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inside a program, ``other(s, ...)`` runs this program's body on state ``s`` now
        and ``s += other(...)`` does the same at that point of ``s``; in a running program,
        ``other(...)`` used as a value is its own run (:class:`NestedCall`). Outside one, the
        call runs the program, as :meth:`run` with the same arguments (``stream``, ``backend``
        and sampling options included), and returns its state."""
        if args and isinstance(args[0], ProgramState):
            return self.call_inline(args[0], self.arguments(args[1:], kwargs))
        if not in_program():
            return self.run(*args, **kwargs)
        arguments = self.arguments(args, kwargs, complete=False)
        run = running_program()
        if run is None:                                    # tracing: a call node
            return Call(self, tuple(arguments.items()))
        backend, defaults = run
        return NestedCall(self, tuple(arguments.items()), start=lambda: self._execute(
            backend, self.arguments((), arguments), defaults, False))

    def call_inline(self, state: ProgramState, arguments: dict[str, Any]) -> Any:
        return self.func(state, **{**self.bound, **arguments})

    # -- running -------------------------------------------------------------------------
    def run(self, *args: Any, stream: bool = False, backend: Backend | None = None,
            **kwargs: Any) -> ProgramState:
        """Run once. Keyword arguments are program arguments or run-wide sampling defaults
        (max_new_tokens=128, temperature=1.0, top_p, top_k, min_p, stop, stop_token_ids,
        frequency_penalty, presence_penalty, repetition_penalty, ignore_eos, seed,
        return_logprob, top_logprobs_num) or scheduling options: ``priority`` (an int, higher
        first; default: the backend's) and ``agent`` (an accounting label; default: the
        program name). Every call the program makes, forks included, inherits them.
        ``stream=True`` returns at once; read the text
        with ``state.text_iter()``."""
        defaults, kwargs = _split_options(dict(kwargs))
        arguments = self.arguments(args, kwargs)
        return self._execute(_resolve_backend(backend), arguments, defaults, stream)

    def _execute(self, backend: Backend, arguments: dict[str, Any], defaults: SamplingOptions,
                 stream: bool) -> ProgramState:
        if defaults.agent is None:
            defaults = dataclasses.replace(defaults, agent=program_label(self.name))
        ctx = RunContext(backend, backend.chat_template(), defaults, stream, name=self.name)
        if defaults.seed is not None:
            ctx.rng.seed(defaults.seed)
        root = StreamExecutor(ctx)
        state = ProgramState(root)
        failure: list[BaseException] = []

        def body() -> None:
            try:
                with program_body((backend, defaults)):
                    state.ret_value = self.func(state, **arguments)
            except BaseException as e:  # noqa: BLE001 - re-raised below or via the stream
                failure.append(e)
                if root.error_ is None:
                    root.error_ = e
            finally:
                ctx.finish(root)

        if stream:
            threading.Thread(target=body, daemon=True, name=f"agentlang-{self.name}").start()
            return state
        body()
        if failure:
            raise failure[0]
        root.sync()
        return state

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Backend | None = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  **options: Any) -> list[ProgramState]:
        """Run the program once per dict of arguments, concurrently. Programs are ordered so
        those sharing prompt prefixes run together, and shared prefixes are cached first.
        Returns states in input order; the first failure is raised after all finished."""
        if not isinstance(batch_kwargs, (list, tuple)):
            raise ValueError("run_batch needs a list of argument dicts")
        defaults, rest = _split_options(dict(options))
        if rest:
            raise ValueError(f"run_batch got unknown options {sorted(rest)}; program "
                             f"arguments go in the dicts of batch_kwargs")
        backend = _resolve_backend(backend)
        batch = [self.arguments((), dict(kw)) for kw in batch_kwargs]
        if not batch:
            return []
        if num_threads == "auto":
            num_threads = min(len(batch), 128)
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be 'auto' or a positive int, got {num_threads!r}")
        plan = plan_batch(self, backend.chat_template(), batch)
        handles = []
        if backend.capabilities.prefix_cache:
            handles = [backend.cache_prefix(p) for p in plan.prefixes]
        bar = None
        if progress_bar:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(batch), desc=self.name)
        results: list[Any] = [None] * len(batch)
        try:
            with ThreadPoolExecutor(num_threads, thread_name_prefix="agentlang-batch") as pool:
                futures = {pool.submit(self._execute, backend, batch[i], defaults, False): i
                           for i in plan.order}
                for fut, i in futures.items():
                    if bar is not None:
                        fut.add_done_callback(lambda _: bar.update(1))
                for fut, i in futures.items():
                    try:
                        results[i] = fut.result()
                    except BaseException as e:  # noqa: BLE001 - raised after all finish
                        results[i] = e
        finally:
            for h in handles:
                backend.release_prefix(h)
            if bar is not None:
                bar.close()
        for i, r in enumerate(results):
            if isinstance(r, BaseException):
                raise r
        return results

    async def arun(self, *args: Any, **kwargs: Any) -> ProgramState:
        """``await program.arun(...)``: ``run`` on its own thread, awaitable from asyncio;
        many concurrent ``arun`` calls are batched by the backend."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def work() -> None:
            try:
                result = self.run(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - delivered to the awaiting task
                loop.call_soon_threadsafe(future.set_exception, e)
                return
            loop.call_soon_threadsafe(future.set_result, result)

        threading.Thread(target=work, daemon=True, name=f"agentlang-arun-{self.name}").start()
        return await future

    def trace(self, *, backend: Backend | None = None, strict: bool = True,
              **kwargs: Any) -> Graph:
        """The dependency graph, from running the body on placeholder arguments (pass some
        as keyword arguments to make them concrete). No model is called; the backend (or
        the default one, else ChatML) only supplies the chat template."""
        from agentlang.backends.mock import DEFAULT_SYSTEM
        from agentlang.chat_template import chatml

        backend = backend if backend is not None else get_default_backend()
        template = backend.chat_template() if backend is not None else chatml(DEFAULT_SYSTEM)
        arguments = self.arguments((), kwargs, complete=False)
        return trace_program(self, template, arguments, strict=strict)
