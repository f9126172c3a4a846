"""The ASGI application: Ollama's and OpenAI's routes, /health and /metrics, behind the Guard.

Every failure a request can cause becomes an answer in its API's error shape (http/errors.py), and the
server goes on serving: ApiError as itself, an unknown route or method as 404/405, a client that left
as nothing (one log line when it left mid-body), and anything unexpected as a 500 with one line (the
traceback goes to the server's log: a bug of the server, never a client's mistake).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hypura.serve.gate import ModelGate
from hypura.serve.generate import embed_routes
from hypura.serve.http import metrics
from hypura.serve.http.errors import ApiError, error_response, is_openai_path
from hypura.serve.http.guard import Guard
from hypura.serve.http.request_log import RequestMetrics
from hypura.serve.http.streaming import ClientGone
from hypura.serve.models.registry import Registry
from hypura.serve.ollama import routes as ollama_routes
from hypura.serve.openai import routes as openai_routes
from hypura.serve.settings import ServeSettings

log = logging.getLogger("hypura.serve")


@dataclass
class ServerState:
    settings: ServeSettings
    registry: Registry = field(default_factory=Registry)
    ready: bool = False  # every model loaded
    error: Optional[str] = None  # why loading failed
    http: Optional[metrics.HttpCounts] = None
    requests: RequestMetrics = field(default_factory=RequestMetrics)  # each engine request's figures, per model


async def health(request: Request):
    state: ServerState = request.app.state.server
    if state.ready:
        return JSONResponse({"status": "ok"})
    message = state.error or "Loading model"
    return JSONResponse({"error": {"code": 503, "message": message, "type": "unavailable_error"}}, status_code=503)


async def prometheus(request: Request):
    state: ServerState = request.app.state.server
    # engine.metrics() reads the engine's counters under its lock: off the loop
    per_model = await asyncio.to_thread(lambda: {e.name: e.engine.metrics() for e in state.registry})
    return PlainTextResponse(metrics.render(per_model, state.http, state.ready, state.requests),
                             media_type="text/plain; version=0.0.4; charset=utf-8")


# routes of both APIs this server does not offer: a 501 that says why beats a bare 404
NOT_SUPPORTED = {
    "/api/pull": "models are the files given to `hypura serve -m` or found in the stores at start: nothing is pulled",
    "/api/push": "models are the files given to `hypura serve -m` or found in the stores at start: nothing is pushed",
    "/api/create": "models are the files given to `hypura serve -m` or found in the stores at start: none are created",
    "/api/copy": "models are the files given to `hypura serve -m` or found in the stores at start: none are copied",
    "/api/delete": "models are the files given to `hypura serve -m` or found in the stores at start: none are deleted",
}


async def not_supported(request: Request):
    raise ApiError(501, f"{request.url.path}: {NOT_SUPPORTED[request.url.path]}")


async def _api_error(request: Request, exc: ApiError) -> Response:
    return error_response(exc, is_openai_path(request.url.path))


async def _http_error(request: Request, exc: HTTPException) -> Response:
    message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
    return error_response(ApiError(exc.status_code, message, headers=exc.headers), is_openai_path(request.url.path))


async def _client_gone(request: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)  # never delivered: the connection is closed


async def _left_mid_body(request: Request, exc: ClientDisconnect) -> Response:
    client = request.client
    log.info("%s%s %s: the client left before sending its whole body", f"{client.host}:{client.port} " if client
             else "", request.method, request.url.path)
    return Response(status_code=499)  # never delivered: the connection is closed


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Starlette raises the exception again after this answer: uvicorn logs its traceback
    error = ApiError(500, f"internal error: {type(exc).__name__}: {str(exc)[:200]}")
    return error_response(error, is_openai_path(request.url.path))


def create_app(state: ServerState):
    """The app for `state`, whose registry fills while models load (requests wait for `ready`)."""
    routes = [Route("/health", health, methods=["GET"]), Route("/metrics", prometheus, methods=["GET"]),
              *ollama_routes.ROUTES, *openai_routes.ROUTES, *embed_routes.ROUTES,
              *(Route(path, not_supported, methods=["GET", "POST", "DELETE"]) for path in NOT_SUPPORTED)]
    state.http = metrics.HttpCounts(r.path for r in routes)
    app = Starlette(routes=routes, exception_handlers={
        ApiError: _api_error, HTTPException: _http_error, ClientGone: _client_gone,
        ClientDisconnect: _left_mid_body, Exception: _unexpected})
    app.state.server = state
    app.state.registry = state.registry
    return Guard(ModelGate(app, state.registry), state)  # the gate loads a request's model on demand
