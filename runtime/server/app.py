"""The FastAPI app over one :class:`~agentlang.runtime.engine.engine.Engine`.

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

from agentlang.runtime.engine.engine import Engine
from agentlang.runtime.server.openai import chat as openai_chat, completions as openai_completions
from agentlang.runtime.server.ops import dashboard, routes as ops
from agentlang.runtime.server.sglang import control as native_control, generate as native_generate, \
    info as native_info, routes as native, sessions as native_sessions
from agentlang.runtime.server.auth import BearerAuth
from agentlang.runtime.server.errors import install_error_handlers
from agentlang.runtime.server.openapi import install_openapi
from agentlang.runtime.server.state import ServerState
from agentlang.runtime.server.streaming import ClientDisconnected

log = logging.getLogger("agentlang.runtime.server")


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
                   native_control, native_sessions, ops, dashboard):
        app.include_router(module.router)
    install_openapi(app, state)
    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key)
    return app
