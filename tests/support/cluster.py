"""N ``agentlang serve`` replicas behind one ``sglang-router``, as real processes on free
loopback ports (used by ``bench/router.py`` and ``tests/server/test_server_router.py``).

- :func:`start_replica` runs ``python -m agentlang.runtime.server`` (the same server as ``agentlang
  serve``) and waits for ``/health``;
- :func:`start_router` runs ``python -m sglang_router.launch_router`` (the Rust router shipped
  in the ``sglang-router`` wheel) over the replicas' URLs and waits until its ``/workers``
  lists every replica as healthy with a discovered model id (not ``"unknown"``);
- :class:`Cluster` owns both and stops them (SIGTERM, SIGKILL after a grace period; each
  process runs in its own session, so a kill reaches its children too).

Logs go to temporary files (never into the repository); :meth:`Proc.log` reads one back.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    """One child process: its name, ``Popen``, base URL and log file."""

    name: str
    proc: subprocess.Popen
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process group now (a crash, as far as its peers can tell)."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, grace_s: float = 15) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit code."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def _spawn(name: str, cmd: list[str], url: str) -> Proc:
    fd, path = tempfile.mkstemp(prefix=f"agentlang-{name}-", suffix=".log")
    with os.fdopen(fd, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                start_new_session=True)
    return Proc(name, proc, url, Path(path))


def _wait(p: Proc, ready, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not p.alive():
            raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.log()[-4000:]}")
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    p.stop(grace_s=5)
    raise RuntimeError(f"{p.name}: {what} not reached in {timeout} s:\n{p.log()[-4000:]}")


def start_replica(*extra: str, name: str = "replica", timeout: float = 240) -> Proc:
    """``python -m agentlang.runtime.server`` on a free port with ``extra`` flags; waits for /health."""
    port = free_port()
    cmd = [sys.executable, "-m", "agentlang.runtime.server", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", *extra]
    p = _spawn(name, cmd, f"http://127.0.0.1:{port}")
    _wait(p, lambda: httpx.get(p.url + "/health", timeout=2).status_code == 200, timeout,
          "/health 200")
    return p


def router_workers(url: str) -> list[dict]:
    """The router's worker list (``GET /workers``)."""
    r = httpx.get(url + "/workers", timeout=5)
    r.raise_for_status()
    return r.json()["workers"]


def start_router(worker_urls: list[str], policy: str = "cache_aware", *extra: str,
                 timeout: float = 120) -> Proc:
    """The sglang-router over ``worker_urls``; waits until every worker is registered, healthy
    and known by its model id."""
    port, metrics_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
           "--port", str(port), "--worker-urls", *worker_urls, "--policy", policy,
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
           "--log-level", "info", *extra]
    p = _spawn("router", cmd, f"http://127.0.0.1:{port}")

    def ready() -> bool:
        ws = router_workers(p.url)
        return len(ws) == len(worker_urls) and all(
            w["is_healthy"] and w["model_id"] != "unknown" for w in ws)

    _wait(p, ready, timeout, f"{len(worker_urls)} healthy workers with a model id")
    return p


@dataclass
class Cluster:
    replicas: list[Proc]
    router: Proc | None = None
    stopped: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.router is not None, "no router started"
        return self.router.url

    def start_router(self, policy: str, *extra: str) -> Proc:
        """(Re)start the router over the live replicas with ``policy``."""
        if self.router is not None:
            self.router.stop(grace_s=5)
        self.router = start_router([r.url for r in self.replicas if r.alive()], policy, *extra)
        return self.router

    def stop(self) -> None:
        for p in ([self.router] if self.router else []) + self.replicas:
            p.stop(grace_s=10)
            self.stopped.append(p.name)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_cluster(n: int, *replica_args: str, policy: str | None = "cache_aware",
                  router_args: tuple[str, ...] = ()) -> Cluster:
    """``n`` replicas (started one after the other, so model loads do not fight for the
    cores), then the router unless ``policy`` is None."""
    replicas: list[Proc] = []
    try:
        for i in range(n):
            replicas.append(start_replica(*replica_args, name=f"replica{i}"))
        cluster = Cluster(replicas)
        if policy is not None:
            cluster.start_router(policy, *router_args)
        return cluster
    except BaseException:
        for r in replicas:
            r.stop(grace_s=5)
        raise
