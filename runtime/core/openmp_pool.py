"""OpenMP thread pools: why a step ran at half speed on the background thread, and the fix.

Cause (measured, see docs/benchmarks.md "Stepping thread"): GNU OpenMP (libgomp, the runtime
torch's CPU wheels and the native library use) keeps one pool of worker threads per thread
that ever ran a parallel region. The thread that loaded the model ran many, so it keeps a pool
(on 2 cores: one worker) after it stops computing; the engine's background thread then gets a
second pool. Once libgomp's managed threads outnumber the CPUs it *throttles* every worker's
spin-wait from ~300,000 iterations to 100 (``gomp_throttled_spin_count_var``), so after each of
the thousands of small parallel regions of a decode step the worker falls asleep on a futex and
the next region waits for it to be woken: the stepping process sits idle (cpu/wall 1.25 instead
of 1.99 on 2 cores) and the step is 15-50 % slower, more where the ops are shortest. The
environment cannot fix it (``GOMP_SPINCOUNT`` does not raise the throttled count;
``OMP_WAIT_POLICY=ACTIVE`` makes the idle pool spin against the stepping thread).

Fix: a thread that hands the engine's computing to another thread frees its own pool with
OpenMP 5.0's ``omp_pause_resource(omp_pause_soft, omp_get_initial_device())`` — libgomp then
joins that thread's workers and lowers its managed count — so only the stepping thread keeps
workers and they spin as if it were the only thread. A later parallel region on the freed
thread builds a new pool (one ``pthread_create``): nothing breaks, it only costs a little.

Only libgomp is handled: LLVM's and Intel's runtimes share one pool process-wide (their soft
pause would pause it for the stepping thread too), and without ``/proc/self/maps`` (not
Linux) nothing is loaded to free. Then :func:`release_thread_pool` does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from typing import NamedTuple

OMP_PAUSE_SOFT = 1                      # omp_pause_resource_t's omp_pause_soft


class _Runtime(NamedTuple):
    pause: Callable[[int, int], int]    # int omp_pause_resource(int kind, int device)
    initial_device: int                 # omp_get_initial_device()


@functools.cache
def _libgomp() -> _Runtime | None:
    """The libgomp already loaded into this process (torch loads it), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(maxsplit=5)[-1].strip() for line in f if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(p for p in paths if os.path.basename(p).startswith("libgomp")):
        try:
            lib = ctypes.CDLL(path)             # already mapped: the same handle, no new copy
            pause, initial = lib.omp_pause_resource, lib.omp_get_initial_device
        except (OSError, AttributeError):
            continue
        pause.restype, pause.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
        initial.restype, initial.argtypes = ctypes.c_int, []
        return _Runtime(pause, initial())
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker threads (no-op where it has none or the
    runtime is not libgomp); whether a libgomp pause ran and succeeded. Call it on a thread
    that is about to wait while another thread computes; never inside a parallel region."""
    rt = _libgomp()
    return rt is not None and rt.pause(OMP_PAUSE_SOFT, rt.initial_device) == 0
