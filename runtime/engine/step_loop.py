"""The thread discipline of the engine: one stepping thread touches engine state.

Callers on any thread :meth:`StepLoop.post` changes (submissions, aborts, unpins) to an inbox
that the step drains first, under :attr:`StepLoop.lock`. Submissions (``arrival=True``: they
only queue a request) may also be taken between the layers of a step in flight
(:meth:`StepLoop.take_arrivals`, :mod:`agentlang.runtime.engine.layer_break`); every other change waits for
the next step, after the arrivals posted before it. Until :meth:`StepLoop.start` the
blocking caller steps the engine itself; afterwards a daemon thread does. The thread holds
the engine's ``step`` only weakly between turns, so an engine nobody references any more is
collected and its loop ends; at interpreter exit the loop stops cleanly (no thread is left
inside a torch op while the process tears down).

Once the thread steps, every other thread of the engine only waits: the thread that starts
the loop and each caller blocked in :meth:`StepLoop.run_until` free their OpenMP workers
first (:func:`agentlang.runtime.core.openmp_pool.release_thread_pool`), so the stepping thread's are the only
ones and run unthrottled (two pools on two cores halved the step).
"""

from __future__ import annotations

import atexit
import ctypes
import queue
import threading
import weakref
from collections.abc import Callable

from agentlang.runtime.core.openmp_pool import release_thread_pool


class StepLoop:
    """``step()`` runs one engine step and returns whether work remains; ``on_error(exc)``
    is called when a background step raises (the loop keeps serving)."""

    def __init__(self, step: Callable[[], bool], on_error: Callable[[Exception], None]):
        self._step = weakref.WeakMethod(step)
        self._on_error = weakref.WeakMethod(on_error)
        self.lock = threading.RLock()      # held for a whole step
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._arrivals: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # nonzero while arrivals wait: the native layers poll it between layers (one call a
        # step, runtime/models/decode_layer.py) and stop only then to let them be taken
        self.pending = ctypes.c_int32(0)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = False

    @property
    def running(self) -> bool:
        """Whether the background thread steps the engine (else the caller must)."""
        return self._thread is not None

    def post(self, change: Callable[[], None], arrival: bool = False) -> None:
        """Queue ``change`` for the stepping thread (runs at the start of the next step, or
        between layers of the step in flight if ``arrival``: it must only queue a request)."""
        (self._arrivals if arrival else self._inbox).put(change)
        if arrival:
            self.pending.value = 1
        self._wake.set()

    def drain(self) -> None:
        """Run the queued changes, arrivals first (a request's submission precedes anything
        posted about it); call with :attr:`lock` held, at the start of a step."""
        self.take_arrivals()
        while not self._inbox.empty():
            self._inbox.get()()

    def take_arrivals(self) -> bool:
        """Run the queued submissions only; whether there were any. Safe mid-step (on the
        stepping thread): they add requests to the waiting queue and touch nothing running."""
        took = False
        self.pending.value = 0          # before the queue: a later arrival sets it again
        while not self._arrivals.empty():
            self._arrivals.get()()
            took = True
        return took

    def run_until(self, done: threading.Event) -> None:
        """Block until ``done`` is set, stepping the engine here if no thread does."""
        if self._thread is not None:
            release_thread_pool()
            done.wait()
            return
        step = self._step()
        while step is not None and not done.is_set():
            step()

    def start(self) -> None:
        """Hand stepping to the background thread (idempotent); the calling thread frees its
        OpenMP workers, as it will only wait from now on."""
        if self._thread is not None:     # fast path: never wait for a running step
            return
        release_thread_pool()
        with self.lock:
            if self._thread is not None:
                return
            self._stop = False
            self._thread = threading.Thread(target=_drive, args=(weakref.ref(self),),
                                            name="agentlang-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def turn(self) -> bool:
        """One turn of the background thread; False once the loop should end."""
        step = self._step()
        if self._stop or step is None:
            return False
        try:
            busy = step()
        except Exception as e:  # keep serving: fail the running requests, not the loop
            on_error = self._on_error()
            if on_error is not None:
                on_error(e)
            busy = False
        del step
        if not busy:
            self._wake.wait(timeout=0.05)
            self._wake.clear()
        return True


def _drive(ref: "weakref.ref[StepLoop]") -> None:
    atexit.register(_stop_at_exit, ref)
    while True:
        loop = ref()
        if loop is None or not loop.turn():
            return
        del loop


def _stop_at_exit(ref: "weakref.ref[StepLoop]") -> None:
    loop = ref()
    if loop is not None:
        loop.shutdown()
