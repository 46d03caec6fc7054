"""HTTP server over the engine: OpenAI-compatible + native APIs, SSE streaming, metrics.

``create_app(engine, api_key=None, served_model_name=None)`` builds the FastAPI app;
``python -m runtime.server`` / ``agentlang serve`` run it (see :mod:`runtime.server.cli`).
"""

from runtime.server.app import create_app
from runtime.server.state import ServerState

__all__ = ["create_app", "ServerState"]
