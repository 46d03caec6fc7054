"""The FastAPI app over one :class:`~runtime.engine.Engine`.

``create_app(engine, api_key=None, served_model_name=None)`` wires the OpenAI-compatible
routes, the native routes and the operations routes to a :class:`ServerState`, installs the
OpenAI-style error handlers and (with ``api_key``) the bearer check. The app's lifespan starts
the engine's background loop and, at shutdown, releases pinned prefixes and stops the loop.
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI
from fastapi.responses import Response

from runtime.engine import Engine
from runtime.server import dashboard, native, native_control, native_generate, \
    native_info, openai_chat, openai_completions, ops
from runtime.server.auth import BearerAuth
from runtime.server.errors import install_error_handlers
from runtime.server.openapi import install_openapi
from runtime.server.state import ServerState
from runtime.server.streaming import ClientDisconnected

log = logging.getLogger("runtime.server")


def create_app(engine: Engine, api_key: str | None = None,
               served_model_name: str | None = None) -> FastAPI:
    state = ServerState(engine, api_key, served_model_name)
    dash = dashboard.DashboardState(engine)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        engine.start_background_loop()
        dash.start()
        try:
            yield
        finally:
            await dash.stop()
            try:
                state.release_all_prefixes()
            finally:
                engine.shutdown()

    app = FastAPI(title="agentlang runtime", version="0.1.0", lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    app.state.server = state
    app.state.dashboard = dash
    install_error_handlers(app)

    @app.exception_handler(ClientDisconnected)
    async def _gone(_req, _exc):  # nobody reads it: the client is gone
        return Response(status_code=499)

    for module in (openai_chat, openai_completions, native_generate, native, native_info,
                   native_control, ops, dashboard):
        app.include_router(module.router)
    install_openapi(app, state)
    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key)
    return app
