"""Compiled-grammar cache with off-loop compilation.

Keyed by (backend name, vocabulary identity, constraint): a ``GrammarCache`` wraps one backend,
whose vocabulary hash (:attr:`TokenVocab.key`) identifies the tokenizer. Compilation runs on a
small thread pool (xgrammar and outlines-core release the GIL while compiling), so ``submit``
returns at once and the engine loop keeps stepping other requests; a request whose grammar is
not ready yet simply waits (check ``future.done()`` each step). Failed compilations with
``ValueError`` (unsupported constraint) stay cached, so a repeated bad request fails fast; any
other exception is not cached. Entries are evicted least-recently-used beyond ``max_entries``
(requests holding a compiled grammar keep it alive).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from agentlang.runtime.grammar.base import CompiledGrammar, GrammarBackend
from agentlang.runtime.grammar.constraints import Constraint


class GrammarCache:
    def __init__(self, backend: GrammarBackend, max_workers: int = 2, max_entries: int = 512):
        if max_workers < 1 or max_entries < 1:
            raise ValueError("max_workers and max_entries must be >= 1")
        self.backend = backend
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="grammar-compile")
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, Future] = OrderedDict()

    def key(self, constraint: Constraint) -> tuple:
        return (self.backend.name, self.backend.vocab.key, constraint)

    def submit(self, constraint: Constraint) -> Future[CompiledGrammar]:
        """Start compiling ``constraint`` (or reuse the cached/in-flight compilation); never
        blocks. ``future.result()`` raises ``ValueError`` naming the field if the backend
        cannot enforce the constraint."""
        key = self.key(constraint)
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return fut
            self.misses += 1
            fut = self._pool.submit(self.backend.compile, constraint)
            self._entries[key] = fut
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        fut.add_done_callback(lambda f: self._forget_unexpected_failure(key, f))
        return fut

    def get(self, constraint: Constraint, timeout: float | None = None) -> CompiledGrammar:
        """Blocking: the compiled grammar (``TimeoutError`` after ``timeout`` seconds)."""
        return self.submit(constraint).result(timeout)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def close(self) -> None:
        """Stop the compile threads; pending compilations are cancelled."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> GrammarCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _forget_unexpected_failure(self, key: tuple, fut: Future) -> None:
        failed = fut.cancelled() or fut.exception() is not None
        if failed and (fut.cancelled() or not isinstance(fut.exception(), ValueError)):
            with self._lock:
                if self._entries.get(key) is fut:
                    del self._entries[key]
