"""The 15 runnable programs of SGLang's own frontend test file (``sglang/test/test_programs.py``
from the installed ``sglang`` 0.5.23 wheel) against ``agentlang serve`` as a real process:

- through SGLang's real frontend (``sgl.RuntimeEndpoint``), and
- in agentlang (``sys.modules["sglang"] = agentlang``, its ``RuntimeEndpoint``),

one process per frontend running the programs concurrently, each under a time limit (SGLang's
executor thread swallows a backend error and the program then waits forever, so a hang is a
failure too). Required: no API error
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


@pytest.fixture(scope="module")
def programs_server():
    srv = start_server("--kv-budget-mb", "512", "--weights", "auto")   # as `make run` serves
    yield srv
    srv.stop()


def _run_mode(url: str, mode: str) -> list[dict]:
    """Every program under one frontend: one process, the programs concurrently."""
    p = subprocess.run([sys.executable, str(RUNNER), url, mode, str(TIME_LIMIT_S), *PROGRAMS],
                       capture_output=True, text=True, timeout=TIME_LIMIT_S + 300)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    results = [{**r, "mode": mode} for r in lines if "test" in r]
    errors = [e for r in lines if "http_errors" in r for e in r["http_errors"]]
    seen = {r["test"] for r in results}
    results += [{"test": t, "outcome": "api_error", "mode": mode,
                 "detail": f"no result (exit {p.returncode}): {p.stderr[-2000:]}"}
                for t in PROGRAMS if t not in seen]
    if errors:
        results.append({"test": "(http)", "outcome": "api_error", "mode": mode,
                        "detail": "non-200 answers", "http_errors": errors})
    return results


def test_sglang_test_programs(programs_server):
    runs = [(mode, t) for t in PROGRAMS for mode in ("sglang", "agentlang")]
    with ThreadPoolExecutor(2) as pool:
        results = [r for rs in pool.map(lambda m: _run_mode(programs_server.url, m),
                                        ("sglang", "agentlang")) for r in rs]
    for r in results:
        print(f"[{r['mode']}] {r['test']}: {r['outcome']} {r.get('detail', '')[:200]!r}")
    bad = [r for r in results if r["outcome"] in ("api_error", "hang")]
    assert not bad, json.dumps(bad, indent=1)[:6000]
    assert sorted((r["mode"], r["test"]) for r in results) == sorted(runs)   # each exactly once


def test_only_the_programs_own_json_parse_is_a_wrong_answer(tmp_path):
    """A JSONDecodeError from the program's own ``json.loads`` of the model's text is content
    (SGLang's REGEX_INT admits ``0663``); one raised anywhere else (a client decoding a
    response) stays an API error."""
    from sglang_programs import _load, _one

    prog = tmp_path / "progs.py"
    prog.write_text("import json\n"
                    "def test_content():\n    json.loads('{\"area\": 0663}')\n"
                    "def test_client():\n    helper()\n")
    module = _load(str(prog))
    helper = tmp_path / "client.py"
    helper.write_text("import json\ndef helper():\n    json.loads('<html>')\n")
    module.helper = _load(str(helper)).helper
    assert _one(module, "test_content")["outcome"] == "wrong_answer"
    assert _one(module, "test_client")["outcome"] == "api_error"
