"""Smoke tests of examples/: each example's ``main`` runs with small token limits and its own
assertions about the result hold (parsed JSON validates, tool results are used, the judge's
verdict is one of the choices, ...). The in-process examples share one ``agentlang.Runtime``;
``openai_client.py`` and the ``--url`` command line run against a real server subprocess."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentlang as al

sys.path.insert(0, str(Path(__file__).parent / "server"))
from server_harness import start_server  # noqa: E402

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# example -> keyword arguments of its main() besides the backend (CI-sized)
IN_PROCESS = {
    "quickstart": dict(max_tokens=16),
    "json_extraction": dict(max_tokens=48),
    "tool_pipeline": dict(max_tokens=48),
    "react_agent": dict(max_tokens=16),
    "multi_agent_debate": dict(max_tokens=16, rounds=2),
    "tree_of_thought": dict(max_tokens=12, depth=2, width=3),
}
OVER_HTTP = {"openai_client": dict(max_tokens=40)}


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runtime():
    backend = al.Runtime()
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def server():
    srv = start_server()
    yield srv
    srv.stop()


def test_every_example_has_a_smoke_test():
    assert {p.stem for p in EXAMPLES.glob("*.py")} == set(IN_PROCESS) | set(OVER_HTTP)


@pytest.mark.parametrize("name", list(IN_PROCESS))
def test_example_in_process(runtime, name):
    result = load_example(name).main(runtime, **IN_PROCESS[name])
    assert result


def test_openai_client_example(server):
    result = load_example("openai_client").main(server.url, **OVER_HTTP["openai_client"])
    assert set(result) == {"chat", "json", "tool_call", "after_tool"}


def test_example_command_line_with_url(server):
    """``python examples/quickstart.py --url URL``: the documented command, end to end."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--url", server.url,
         "--max-tokens", "16"], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")))
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
