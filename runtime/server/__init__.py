"""HTTP server over the engine: OpenAI-compatible + native APIs, SSE streaming, metrics.

``create_app(engine, api_key=None, served_model_name=None)`` builds the FastAPI app;
``python -m agentlang.runtime.server`` / ``agentlang serve`` run it (see :mod:`agentlang.runtime.server.cli`).
"""

from agentlang.runtime.server.app import create_app
from agentlang.runtime.server.state import ServerState

__all__ = ["create_app", "ServerState"]
