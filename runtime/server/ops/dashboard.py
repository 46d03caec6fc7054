"""The live dashboard: ``GET /dashboard`` (static page shipped in ``runtime/server/static``),
``GET /dashboard/static/{file}`` and ``GET /dashboard/data`` (JSON, polled by the page once a
second).

``/dashboard/data?max_nodes=N`` (0..20000; default 500, what the page asks for) answers the
document built by :mod:`agentlang.runtime.server.ops.dashboard_data` from one ``Engine.snapshot`` (taken in a
worker thread; the engine pays only the copy under its step lock, reported as ``cost_ms``).
A :class:`SeriesSampler` records the last minutes (output tokens/s, prefix hit rate, queue length,
KV use) once a second, whether or not a page is open. With an API key set the page and its
static files are open (they carry no data) and ``/dashboard/data`` needs the Bearer header like
every other route.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from importlib import resources

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from agentlang.runtime.engine.engine import Engine
from agentlang.runtime.engine.snapshot import MAX_SNAPSHOT_NODES, check_max_nodes
from agentlang.runtime.server.ops import dashboard_data
from agentlang.runtime.server.errors import APIError, from_value_error
from agentlang.runtime.server.ops.programs import ProgramTracker

router = APIRouter()
log = logging.getLogger("agentlang.runtime.server")

STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css",
          "dashboard.html": "text/html"}
OPEN_PATHS = frozenset({"/dashboard"} | {f"/dashboard/static/{f}" for f in STATIC})
SERIES_KEYS = ("t", "tokens_per_s", "hit_rate", "queue", "kv_use", "running")


class SeriesSampler:
    """Once per ``period_s``: a metrics-only engine snapshot → one point of each series
    (kept for ``keep`` points). Rates are over the last interval."""

    def __init__(self, engine: Engine, period_s: float = 1.0, keep: int = 300):
        self.engine = engine
        self.period_s = period_s
        self.points: deque[tuple] = deque(maxlen=keep)
        self.last: tuple[float, float, float, float] | None = None  # t, generated, hits, queried

    def sample(self) -> None:
        snap = self.engine.snapshot(max_nodes=0, pages=False)
        m, t = snap.metrics, snap.time
        now = (t, m["generated_tokens"], m["prefix_cache_hit_tokens"],
               m["prefix_cache_queried_tokens"])
        if self.last is not None and t > self.last[0]:
            dt = t - self.last[0]
            queried = now[3] - self.last[3]
            hit = (now[2] - self.last[2]) / queried if queried else None
            self.points.append((round(t, 3), round((now[1] - self.last[1]) / dt, 2), hit,
                                m["num_waiting"], m["kv_utilization"], m["num_running"]))
        self.last = now

    async def run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.sample)
            except Exception:  # noqa: BLE001 - a failed sample is a gap, not a dead sampler
                log.exception("dashboard: sampling the engine failed")
            await asyncio.sleep(self.period_s)

    def series(self) -> dict[str, list]:
        cols = list(zip(*self.points)) if self.points else [()] * len(SERIES_KEYS)
        return {k: list(c) for k, c in zip(SERIES_KEYS, cols)}


class DashboardState:
    """What the dashboard keeps per app: the program graphs and the series sampler."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.programs = ProgramTracker()
        self.sampler = SeriesSampler(engine)
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.sampler.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    def data(self, max_nodes: int) -> dict:
        snap = self.engine.snapshot(max_nodes=max_nodes)
        return dashboard_data.build(snap, self.engine.tokenizer, self.programs,
                                    self.sampler.series())


def _static(name: str) -> Response:
    body = resources.files("agentlang.runtime.server").joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"cache-control": "no-cache"})


@router.get("/dashboard", include_in_schema=False)
async def page():
    return _static("dashboard.html")


@router.get("/dashboard/static/{name}", include_in_schema=False)
async def static(name: str):
    if name not in STATIC:
        raise APIError(404, f"name: no such dashboard file {name!r}; files: {sorted(STATIC)}",
                       "name", "not_found")
    return _static(name)


@router.get("/dashboard/data", responses={400: {"description": "bad max_nodes"}})
async def data(request: Request, max_nodes: str = Query(
        "500", description="radix-tree nodes to include, most recently used first",
        json_schema_extra={"type": "integer", "minimum": 0, "maximum": MAX_SNAPSHOT_NODES,
                           "default": 500})):
    """Live state for the dashboard page (see the module docstring). 400 names ``max_nodes``
    and the accepted range when it is not an integer in [0, 20000] (parsed here, not by
    FastAPI, so the message can say so)."""
    try:
        max_nodes = check_max_nodes(int(max_nodes) if max_nodes.isdigit() else max_nodes)
    except ValueError as e:
        raise from_value_error(e) from None
    dash: DashboardState = request.app.state.dashboard
    return JSONResponse(await asyncio.to_thread(dash.data, max_nodes))
