"""The ASGI layer that loads a request's model before its route runs, and keeps it loaded while it runs.

For the generation routes (POST with a JSON "model"), the body is read (the Guard bounds it), the model
acquired from the registry (waiting for its load, if any) and the route run with the body replayed; when
the route's answer has ended (a stream included), the model is released with the request's keep_alive.
Ollama's `keep_alive: 0` with nothing to generate unloads the model and answers done_reason "unload".
"""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hypura.serve.http.errors import ApiError, bad_request, error_response, is_openai_path
from hypura.serve.keep_alive import KeepAliveError, parse_keep_alive
from hypura.serve.models.registry import LEASED
from hypura.serve.ollama import routes as ollama_routes

log = logging.getLogger("hypura.serve")
MODEL_ROUTES = frozenset({"/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/v1/chat/completions",
                          "/v1/completions", "/v1/embeddings"})


class ModelGate:
    def __init__(self, app: ASGIApp, registry):
        self.app, self.registry = app, registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in MODEL_ROUTES:
            await self.app(scope, receive, send)
            return
        try:
            body = await _read_body(receive)
            if body is None:  # the client left mid-body: one line, as the routes log it
                log.info("%s %s: the client left before sending its whole body", scope["method"], path)
                return
            data = await asyncio.to_thread(_json, body)  # up to 8 MiB of JSON: off the loop
            model = data.get("model")
            if not isinstance(model, str) or not model:
                await self.app(scope, _replay(body, receive), send)  # the route says what is wrong
                return
            keep_alive = _keep_alive(data) if path.startswith("/api/") else None
            if keep_alive == 0 and _nothing_to_generate(path, data):
                await asyncio.to_thread(self.registry.unload, model)
                answer = ollama_routes.load_answer(self.registry.find(model).name, path == "/api/chat", "unload")
                await answer(scope, receive, send)
                return
            entry = await self.registry.acquire(model)
            scope[LEASED] = entry  # the route serves the entry leased here (Registry.get)
        except ApiError as e:
            await error_response(e, is_openai_path(path))(scope, receive, send)
            return
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.registry.release(entry, keep_alive)


async def _read_body(receive: Receive):
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = [False]

    async def replay() -> Message:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then the client's disconnect, which streaming routes watch for

    return replay


def _json(body: bytes) -> dict:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}  # the route answers the 400
    return data if isinstance(data, dict) else {}


def _keep_alive(data: dict):
    if data.get("keep_alive") is None:
        return None
    try:
        return parse_keep_alive(data["keep_alive"])
    except KeepAliveError as e:
        raise bad_request(str(e)) from None


def _nothing_to_generate(path: str, data: dict) -> bool:
    """Ollama loads (or with keep_alive 0 unloads) a model for a request with no prompt and no messages."""
    if path == "/api/generate":
        return not data.get("prompt") and not data.get("context")
    return path == "/api/chat" and not data.get("messages")
