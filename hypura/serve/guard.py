"""The ASGI layer in front of every route: API key, request body bound, 503 while loading, request counts.

A plain ASGI wrapper (not Starlette's BaseHTTPMiddleware, which would buffer streamed responses and
hide the client's disconnect from the routes). Its refusals answer in the shape of the API called.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hypura.serve.errors import ApiError, error_response, is_openai_path

OPEN_PATHS = frozenset({"/health"})  # reachable without the API key (load balancers, probes)
OPEN_WHILE_LOADING = frozenset({"/", "/health", "/metrics", "/api/version"})


class Guard:
    def __init__(self, app: ASGIApp, state):
        self.app, self.state = app, state
        key = state.settings.api_key
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        status = []

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            refusal = self._refusal(scope, path)
            if refusal is not None:
                await error_response(refusal, is_openai_path(path))(scope, receive, counting_send)
                return
            await self.app(scope, self._bounded(scope, receive), counting_send)
        finally:
            self.state.http.count(path, status[0] if status else 499)  # 499: the client left before an answer

    def _refusal(self, scope: Scope, path: str):
        headers = dict(scope["headers"])
        if self.expected is not None and path not in OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                return ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "invalid_api_key",
                                {"WWW-Authenticate": "Bearer"})
        if not self.state.ready and path not in OPEN_WHILE_LOADING:
            return ApiError(503, self.state.error or "loading model", None, {"Retry-After": "1"})
        length = headers.get(b"content-length")
        limit = self.state.settings.max_body_bytes
        if length is not None and not length.isdigit():  # uvicorn's parsers refuse these first; kept for others
            return ApiError(400, "the Content-Length header is not a number")
        if length is not None and int(length) > limit:
            return ApiError(413, f"the request body is larger than {limit} bytes")
        return None

    def _bounded(self, scope: Scope, receive: Receive) -> Receive:
        """`receive` that fails once a chunked body passes the limit (Content-Length was checked already)."""
        limit, seen = self.state.settings.max_body_bytes, [0]

        async def bounded_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > limit:
                    raise ApiError(413, f"the request body is larger than {limit} bytes")
            return message

        return bounded_receive
