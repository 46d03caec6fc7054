"""Only the stepping thread keeps OpenMP workers (agentlang.runtime.core.openmp_pool): the engine's
constructor, ``StepLoop.start`` and a caller waiting in ``StepLoop.run_until`` free their
thread's libgomp pool, so the background step is not throttled by an idle pool.

Each check runs in a fresh interpreter and counts the process's OS threads: a libgomp pool
on a thread adds ``torch.get_num_threads() - 1`` workers, and freeing it joins them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import os, threading, torch
torch.set_num_threads(2)
count = lambda: len(os.listdir("/proc/self/task"))
parallel_op = lambda: torch.randn(4_000_000).exp_()     # above the grain size: a pool
"""


def run_script(body: str, *args: str) -> str:
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module", autouse=True)
def _gnu_openmp():
    out = run_script("""
        from agentlang.runtime.core.openmp_pool import release_thread_pool
        print(release_thread_pool())
    """)
    if out.strip() != "True":
        pytest.skip("torch's OpenMP runtime here is not libgomp: nothing to release")


def test_release_frees_the_calling_threads_workers():
    out = run_script("""
        from agentlang.runtime.core.openmp_pool import release_thread_pool
        base = count(); parallel_op(); held = count()
        assert held == base + 1, (base, held)
        assert release_thread_pool() and count() == base, count()
        assert release_thread_pool() and count() == base     # no pool: nothing to do
        parallel_op(); assert count() == base + 1             # a later region builds a new one
        print("ok")
    """)
    assert out.strip() == "ok"


def test_step_loop_start_and_waiting_callers_free_their_pools():
    out = run_script("""
        from agentlang.runtime.engine.step_loop import StepLoop

        class Idle:                       # a step with no work (StepLoop holds it weakly)
            def step(self): return False
            def error(self, e): raise e

        idle = Idle()
        loop = StepLoop(idle.step, idle.error)
        base = count(); parallel_op()
        assert count() == base + 1
        loop.start()                      # +1 stepping thread, -1 this thread's worker
        assert count() == base + 1, count()

        done, entered = threading.Event(), threading.Event()
        def waiter():
            parallel_op(); entered.set()  # a caller thread with a pool of its own
            loop.run_until(done)
        t = threading.Thread(target=waiter, daemon=True); t.start(); entered.wait()
        for _ in range(200):              # +1 waiter thread, its worker joined on waiting
            if count() == base + 2: break
            threading.Event().wait(0.01)
        assert count() == base + 2, count()
        done.set(); t.join(); loop.shutdown()
        print("ok")
    """)
    assert out.strip() == "ok"


def test_engine_constructor_frees_the_loaders_pool(tiny_llama_dir):
    out = run_script("""
        import sys
        from agentlang.runtime.engine.engine import Engine
        parallel_op(); held = count()
        engine = Engine(sys.argv[1], kv_budget_mb=8)
        assert count() == held - 1, (held, count())
        print("ok")
    """, str(tiny_llama_dir))
    assert out.strip() == "ok"
