"""The 15 runnable programs of SGLang's own frontend test file (``sglang/test/test_programs.py``
from the installed ``sglang`` 0.5.23 wheel) against ``agentlang serve`` as a real process:

- through SGLang's real frontend (``sgl.RuntimeEndpoint``), and
- in agentlang (``sys.modules["sglang"] = agentlang``, its ``RuntimeEndpoint``),

each program in its own process under a time limit (SGLang's executor thread swallows a backend
error and the program then waits forever, so a hang is a failure too). Required: no API error
(no non-200 answer, no client exception) and no hang. Wrong answers of a 135M model are allowed;
they are printed (``pytest -s``) and listed in docs/server.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_harness import start_server

pytest.importorskip("sglang", reason="the sglang frontend is installed by `make install`")

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("sglang_programs.py")
sys.path.insert(0, str(RUNNER.parent))
from sglang_programs import PROGRAMS  # noqa: E402

TIME_LIMIT_S = 1200         # one program; the slowest took ~11 min on 2 cores at load ~34
PARALLEL = 8               # both modes share the pool; the server batches their requests


@pytest.fixture(scope="module")
def programs_server():
    srv = start_server("--kv-budget-mb", "256")
    yield srv
    srv.stop()


def _run(url: str, test: str, mode: str) -> dict:
    try:
        p = subprocess.run([sys.executable, str(RUNNER), url, test, mode], capture_output=True,
                           text=True, timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        return {"test": test, "outcome": "hang", "detail": f"over {TIME_LIMIT_S} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('{"test"')]
    if not lines:
        return {"test": test, "outcome": "api_error",
                "detail": f"exit {p.returncode}: {p.stderr[-2000:]}"}
    return json.loads(lines[-1])


def test_sglang_test_programs(programs_server):
    runs = [(mode, t) for t in PROGRAMS for mode in ("sglang", "agentlang")]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda r: {**_run(programs_server.url, r[1], r[0]),
                                           "mode": r[0]}, runs))
    for r in results:
        print(f"[{r['mode']}] {r['test']}: {r['outcome']} {r.get('detail', '')[:200]!r}")
    bad = [r for r in results if r["outcome"] in ("api_error", "hang")]
    assert not bad, json.dumps(bad, indent=1)[:6000]
    assert sorted((r["mode"], r["test"]) for r in results) == sorted(runs)
