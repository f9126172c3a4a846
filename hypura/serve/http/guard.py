"""The ASGI layer in front of every route: Host and Origin (origins.py), CORS, API key, request body bound
and deadline, 503 while loading, request counts.

A plain ASGI wrapper (not Starlette's BaseHTTPMiddleware, which would buffer streamed responses and
hide the client's disconnect from the routes). Its refusals answer in the shape of the API called. Once an
answer has ended it writes the request's one log line (request_log.py; uvicorn's access log is off).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hypura.serve.http import lifecycle, request_log
from hypura.serve.http.errors import ApiError, error_response, is_openai_path
from hypura.serve.http.origins import Origins, cors_headers, preflight_headers

log = logging.getLogger("hypura.serve")
OPEN_PATHS = frozenset({"/health"})  # reachable without the API key (load balancers, probes)
OPEN_WHILE_LOADING = frozenset({"/", "/health", "/metrics", "/api/version"})


def _preflight(origin: str, asked: str) -> Response:
    response = Response(status_code=204)
    response.raw_headers.extend(preflight_headers(origin, asked))
    return response


class Guard:
    def __init__(self, app: ASGIApp, state):
        self.app, self.state = app, state
        settings = state.settings
        self.key = settings.api_key.encode() if settings.api_key else None
        self.origins = Origins(settings.host, settings.allowed_hosts, settings.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        status = []
        started, record = time.monotonic(), request_log.opened()
        headers = dict(scope["headers"])
        origin = headers.get(b"origin", b"").decode("latin-1")
        cors = cors_headers(origin) if origin and self.origins.origin_allowed(origin) else []

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        try:
            refusal = self._where_from(headers, origin)
            if refusal is None and cors and scope["method"] == "OPTIONS" and \
                    b"access-control-request-method" in headers:
                asked = headers.get(b"access-control-request-headers", b"").decode("latin-1")
                await _preflight(origin, asked)(scope, receive, send)
                status.append(204)
                return
            refusal = refusal or self._refusal(headers, path)
            if refusal is not None:
                await error_response(refusal, is_openai_path(path))(scope, receive, counting_send)
                return
            bounded = self._bounded(scope, receive)
            lifecycle.watch_client(bounded)  # prompt work stops when the client goes
            await self.app(scope, bounded, counting_send)
        finally:
            self.state.http.count(path, status[0] if status else 499)  # 499: the client left before an answer
            self._log(scope, status[0] if status else 499, time.monotonic() - started, record)

    def _log(self, scope: Scope, status: int, seconds: float, record: list) -> None:
        """The request's one line, and its engine requests' figures into /metrics."""
        ended = request_log.results(record)
        for model, result in ended:
            if result is not None:
                self.state.requests.add(model, result)
        client = scope.get("client")
        log.info("%s", request_log.line(f"{client[0]}:{client[1]} " if client else "", scope["method"], scope["path"],
                                        status, seconds, ended))

    def _where_from(self, headers: dict, origin: str):
        """403 for a Host this server does not answer to or a web page's Origin not allowed (no work done)."""
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.origins.host_allowed(host):
            return ApiError(403, f"Host '{host[:100]}' is not allowed: start the server with --allowed-hosts "
                                 "NAME to answer to it")
        if origin and not self.origins.origin_allowed(origin):
            return ApiError(403, f"Origin '{origin[:100]}' is not allowed: start the server with --cors-origin "
                                 "ORIGIN to let its pages call it")
        return None

    def _key_given(self, headers: dict) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)

    def _refusal(self, headers: dict, path: str):
        if self.key is not None and path not in OPEN_PATHS:
            if not self._key_given(headers):
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
        """`receive` that fails once a chunked body passes the limit (Content-Length was checked already),
        or when the body is not complete `--timeout` seconds after the request came (a slow client)."""
        limit, seen, done = self.state.settings.max_body_bytes, [0], [False]
        timeout = self.state.settings.timeout_s
        deadline = time.monotonic() + timeout

        async def bounded_receive() -> Message:
            if done[0]:  # the body is read: what comes now is the disconnect, awaited as long as it takes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise ApiError(408, f"the request body did not arrive within {timeout:g} s (--timeout)") from None
            done[0] = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > limit:
                    raise ApiError(413, f"the request body is larger than {limit} bytes")
            return message

        return bounded_receive
