"""Helpers of the server tests: start the real server as a subprocess (``python -m
agentlang.runtime.server``) on a free port on 127.0.0.1, and read its ``/metrics``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.support.cluster import free_port  # noqa: E402  (one owner of port picking)

KV_BUDGET_MB = "48"        # ~1000 tokens: small, so the load test exercises a full pool
API_KEY = "test-secret-key"


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str
    log_path: Path

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> int:
        """Ctrl-C (SIGINT) by default; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_server(*extra: str, timeout: float = 180) -> ServerProcess:
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="agentlang-server-", suffix=".log")[1])
    log = open(log_path, "w")
    cmd = [sys.executable, "-m", "agentlang.runtime.server", "--host", "127.0.0.1", "--port", str(port),
           "--kv-budget-mb", KV_BUDGET_MB, "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server did not become healthy in {timeout} s:\n{server.log()}")


def metrics(http: httpx.Client) -> dict[str, float]:
    """``/metrics`` parsed with prometheus_client's parser: sample name → value."""
    from prometheus_client.parser import text_string_to_metric_families

    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            key = s.name + ("" if not s.labels else str(sorted(s.labels.items())))
            out[key] = s.value
    return out


def wait_idle(http: httpx.Client, timeout: float = 30) -> dict[str, float]:
    """Poll until no request is running or waiting; returns the metrics then."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(http)
        if m["agentlang_num_requests_running"] == 0 and m["agentlang_num_requests_waiting"] == 0:
            return m
        assert time.monotonic() < deadline, f"engine still busy after {timeout} s: {m}"
        time.sleep(0.1)


def pages_after_flush(http: httpx.Client, timeout: float = 30) -> float:
    """Wait until idle, flush the prefix cache, and return the KV pages still in use: what no
    finished request holds (pinned prefixes only). Equal before and after a test when every
    request of the test gave its pages back."""
    wait_idle(http, timeout)
    http.post("/flush_cache").raise_for_status()
    return metrics(http)["agentlang_kv_pages_used"]
