"""Bearer-token check as a plain ASGI middleware (it must not buffer streaming responses).

With an API key set, every HTTP request except ``GET /health``, ``/health_generate`` (open, as
in SGLang) and the dashboard's page and static files (they carry no data; the page asks for the
key and sends it on its data requests) needs ``Authorization: Bearer <key>``; anything else gets
a 401 OpenAI-style error."""

from __future__ import annotations

import hmac
import json

from agentlang.runtime.server.ops import dashboard
from agentlang.runtime.server.errors import error_body

OPEN_PATHS = frozenset({"/health", "/health_generate"}) | dashboard.OPEN_PATHS  # as in SGLang


class BearerAuth:
    def __init__(self, app, api_key: str):
        if not isinstance(api_key, str) or not api_key:
            raise ValueError("api_key: must be a non-empty string")
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        reason = "missing" if not given else "wrong"
        body = json.dumps(error_body(
            f"Unauthorized: {reason} API key; send 'Authorization: Bearer <key>'",
            "invalid_request_error", None, "invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
