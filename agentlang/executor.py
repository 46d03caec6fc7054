"""Stream executors: one worker thread per stream, running submitted IR in order.

Each stream (the root program state, every fork) has a ``StreamExecutor`` whose worker thread
executes submitted expressions in order (through an ``Interpreter``, interpreter.py, for
which the executor is the ``Stream``), so
the program body runs ahead of the model: after ``forks += gen(...)`` all branches generate
at once and the backend batches them. Reading a variable (``s["x"]``) waits for the stream to
catch up; an error in a worker is kept and re-raised in the program's thread on that sync.

Fork/join: ``fork_streams`` returns the children at once and queues the fork on the parent's
stream (fork_record.py); the parent's worker, when it gets there, commits the parent's text
once through ``backend.cache_prefix`` (prefilled and locked in the radix cache), copies its
state into the children and only then lets them start. So a program that forks several states
in a loop (a tree's frontier) does not wait for one prefix commit (an engine step) per state:
their commits reach the backend together. The lock is released when the branches are joined —
or when the run ends, for forks nobody joined.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agentlang.backends.base import Backend, Prompt
from agentlang.branch import BranchId
from agentlang.chat_template import ChatTemplate
from agentlang.fork_record import ForkGate, ForkRecord, ForkStart, start_children
from agentlang.interpreter import Interpreter, JoinItem
from agentlang.ir import Expr
from agentlang.runtime.core.typed_values import VALUE_TYPE_STOP
from agentlang.sampling import SamplingOptions


@dataclass
class RunContext:
    """What all streams of one run share."""

    backend: Backend
    template: ChatTemplate
    defaults: SamplingOptions
    stream: bool = False
    name: str = "program"
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    rng: random.Random = field(default_factory=random.Random)
    executors: list[StreamExecutor] = field(default_factory=list)
    forks: list[ForkRecord] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def release(self, record: ForkRecord) -> None:
        with self.lock:
            if record.released:
                return
            record.released = True
        if record.handle is not None:
            self.backend.release_prefix(record.handle)

    def finish(self, root: StreamExecutor) -> None:
        """End every stream (draining its queue), release prefixes still held, and make an
        error of a fork nobody joined or read the run's error."""
        forks = [exe for exe in self.executors if exe is not root]
        for exe in forks:
            exe.end()
        for exe in forks:
            exe.worker.join()
        failed = next((exe.error_ for exe in forks if exe.error_ is not None), None)
        if failed is not None and root.error_ is None:
            root.error_ = failed
        root.end()
        root.worker.join()
        for record in list(self.forks):
            self.release(record)
        self.backend.end_run(self.run_id)


@dataclass
class _VarStream:
    chunks: list[str] = field(default_factory=list)
    done: bool = False


class StreamExecutor:
    """One stream: its text, messages, variables and worker thread (implements the
    interpreter's ``Stream`` protocol and ``ProgramState``'s stream protocol)."""

    def __init__(self, ctx: RunContext, branch: BranchId = BranchId(),
                 gate: ForkRecord | None = None):
        """``gate``: the fork this stream is a child of; it runs nothing before the parent's
        worker has copied the parent's state into it (``fork_record.start_children``)."""
        self.ctx = ctx
        self.branch = branch
        self.gens = 0        # generations started by this stream
        self.forks = 0       # forks made by this stream
        self.text_ = ""
        self.messages_: list[dict] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.written: set[str] = set()   # variables written by this stream (for join)
        self.cur_role: str | None = None
        self.cur_role_begin = 0
        self.scopes: dict[str, int] = {}
        self.fork_start = 0
        self.fork_messages = 0
        self._ended = False
        self.error_: BaseException | None = None
        self.finished = False
        self.cond = threading.Condition()
        self.var_streams: dict[str, _VarStream] = {}
        self.queue: queue.Queue = queue.Queue()
        self.interpreter = Interpreter(self)
        with ctx.lock:
            ctx.executors.append(self)
        if gate is not None:
            self.queue.put(ForkGate(gate))
        self.worker = threading.Thread(target=self._work, daemon=True, name="agentlang-stream")
        self.worker.start()

    # -- plumbing ----------------------------------------------------------------------
    def submit(self, item: Expr | JoinItem) -> None:
        self.queue.put(item)

    def sync(self) -> None:
        """Wait until everything submitted has run; re-raise a worker error."""
        self.queue.join()
        if self.error_ is not None:
            raise self.error_

    def end(self) -> None:
        """Stop the worker after what is queued; idempotent."""
        with self.cond:
            if self._ended:
                return
            self._ended = True
        self.queue.put(None)

    def _work(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    break
                if isinstance(item, ForkStart):       # even after an error: children wait
                    start_children(self, item.record)
                elif isinstance(item, ForkGate):
                    item.record.ready.wait()
                    self.error_ = item.record.error
                elif self.error_ is None:
                    self.interpreter.execute(item)
            except BaseException as e:  # noqa: BLE001 - handed to the program thread
                self.error_ = e
            finally:
                self.queue.task_done()
        with self.cond:
            self.finished = True
            for vs in self.var_streams.values():
                vs.done = True
            self.cond.notify_all()

    # -- the stream protocol used by ProgramState (program thread) -----------------------
    def fork_streams(self, size: int) -> tuple[list[StreamExecutor], ForkRecord]:
        """Called from the program thread: ``size`` children that start once this stream's
        worker reaches the fork point (``fork_record.start_children``). An error this stream already has is
        raised here; one that comes before the fork point reaches the children instead."""
        if self.error_ is not None:
            raise self.error_
        record = ForkRecord([], self.forks)
        self.forks += 1
        with self.ctx.lock:
            self.ctx.forks.append(record)
        record.children.extend(StreamExecutor(self.ctx, gate=record) for _ in range(size))
        self.submit(ForkStart(record))
        return record.children, record

    def join_streams(self, record: ForkRecord, streams: list, mode: str) -> None:
        self.submit(JoinItem(record, mode))

    def get_var(self, name: str) -> Any:
        self.sync()
        if name not in self.variables:
            raise KeyError(f"no variable {name!r} in this state; defined: "
                           f"{sorted(self.variables)}")
        return self.variables[name]

    def set_var(self, name: str, value: Any) -> None:
        self.sync()
        self.store_var(name, value)

    def has_var(self, name: str) -> bool:
        self.sync()
        return name in self.variables

    def get_meta_info(self, name: str) -> Any:
        self.sync()
        return self.meta_info.get(name)

    def text(self) -> str:
        self.sync()
        return self.text_

    def messages(self) -> list[dict]:
        self.sync()
        return list(self.messages_)

    def iter_text(self, name: str | None = None) -> Iterator[str]:
        if not self.ctx.stream:
            yield self.text() if name is None else str(self.get_var(name))
            return
        if name is None:
            pos = 0
            while True:
                with self.cond:
                    while len(self.text_) == pos and not self.finished:
                        self.cond.wait()
                    chunk, done = self.text_[pos:], self.finished
                    pos += len(chunk)
                if chunk:
                    yield chunk
                if done:
                    break
        else:
            with self.cond:
                while name not in self.var_streams and not self.finished:
                    self.cond.wait()
                vs = self.var_streams.get(name)
            if vs is None and self.error_ is None:
                raise KeyError(f"the program never set variable {name!r}")
            seen = 0
            while vs is not None:
                with self.cond:
                    while len(vs.chunks) == seen and not vs.done:
                        self.cond.wait()
                    new, done = vs.chunks[seen:], vs.done
                    seen += len(new)
                yield from (c for c in new if c)
                if done:
                    break
        if self.error_ is not None:
            raise self.error_

    # -- state helpers (worker thread) ---------------------------------------------------
    def fill(self, text: str) -> None:
        if text:
            with self.cond:
                self.text_ += text
                self.cond.notify_all()

    def replace_tail(self, old: str, new: str) -> None:
        """The text's last ``old`` (a generation just appended) becomes ``new``; nothing when
        the text does not end with it. A streamed state keeps its text (its readers have it)."""
        if old == new or self.ctx.stream or not self.text_.endswith(old):
            return
        with self.cond:
            self.text_ = self.text_[:len(self.text_) - len(old)] + new
            self.cond.notify_all()

    def begin_role(self, role: str) -> None:
        first = not self.messages_ and self.cur_role is None
        text, messages = self.ctx.template.open_role(role, first)
        self.messages_.extend(messages)
        self.fill(text)
        self.cur_role, self.cur_role_begin = role, len(self.text_)

    def end_role(self, role: str) -> None:
        content = self.text_[self.cur_role_begin:]
        self.fill(self.ctx.template.close_role(role))
        self.messages_.append({"role": role, "content": content})
        self.cur_role = None

    def prompt(self, tag: dict | None = None) -> Prompt:
        open_text = self.text_[self.cur_role_begin:] if self.cur_role else ""
        return Prompt(self.text_, tuple(self.messages_), self.cur_role, open_text, tag)

    def open_var_stream(self, name: str | None) -> _VarStream:
        vs = _VarStream()
        if name is not None:
            with self.cond:
                self.var_streams[name] = vs
                self.cond.notify_all()
        return vs

    def append_var_stream(self, vs: _VarStream, chunk: str) -> None:
        with self.cond:
            vs.chunks.append(chunk)
            self.cond.notify_all()

    def store_var(self, name: str | None, value: Any, meta: Any = None) -> None:
        if name is None:
            return
        with self.cond:
            self.variables[name] = value
            self.meta_info[name] = meta
            self.written.add(name)
            vs = self.var_streams.get(name)
            if vs is None or vs.done:
                vs = self.var_streams[name] = _VarStream([value if isinstance(value, str)
                                                          else json.dumps(value)])
            vs.done = True
            self.cond.notify_all()

    def resolve(self, options: SamplingOptions) -> SamplingOptions:
        opts = options.merged_over(self.ctx.defaults)
        opts = opts.with_extra_stop(self.ctx.template.stop_str + VALUE_TYPE_STOP[opts.value_type])
        self.ctx.backend.check(opts)
        return opts

    def generate_text(self, opts: SamplingOptions, name: str | None = None) -> tuple[str, Any]:
        """Generate under ``opts`` at the current position, append the text, return it."""
        backend, prompt = self.ctx.backend, self.prompt(self.branch.tag(self.ctx.run_id, self.ctx.name))
        self.gens += 1
        if not self.ctx.stream:
            result = backend.generate(prompt, opts)
            self.fill(result.text)
            return result.text, result
        vs, text, result = self.open_var_stream(name), "", None
        for delta in backend.stream(prompt, opts):
            text += delta.text
            self.fill(delta.text)
            self.append_var_stream(vs, delta.text)
            result = delta.result if delta.result is not None else result
        return text, result
