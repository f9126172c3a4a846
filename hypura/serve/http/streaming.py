"""Responses that end when the client goes away: NDJSON and SSE streams, and waits for a whole result.

Both watch the connection with a task that reads ASGI `receive()` until `http.disconnect` (the body
was read before, so nothing else arrives; uvicorn answers `http.disconnect` once the response is
complete too). When the client disconnects first, the work is cancelled: the `EngineStream.events()`
iterator is closed, which cancels the engine request and frees its sequence and KV cache at once,
instead of decoding for nobody until max_tokens. When the server shuts down (lifecycle.stopping()), a
stream ends with an error chunk (SSE: then `data: [DONE]`) and a wait answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from starlette.types import Receive, Scope, Send

from hypura.serve.http import lifecycle
from hypura.serve.http.errors import ApiError

T = TypeVar("T")
SHUTTING_DOWN = "the server is shutting down"

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


def ndjson(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def sse(obj) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


ClientGone = lifecycle.ClientGone  # the client disconnected before the work was done
_disconnected = lifecycle.disconnected


async def race_disconnect(receive: Receive, work: Awaitable[T], stop: bool = True) -> T:
    """`await work`, or cancel it and raise ClientGone if the client disconnects first (or, with `stop`,
    ApiError 503 if the server shuts down first).

    The work runs as a task of its own beside the watcher, so its exceptions reach the caller as they
    are; a cancelled work has finished its cleanup (closing its event iterator) when this returns."""
    job, watcher = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(receive))
    stop = asyncio.ensure_future(lifecycle.stopping().wait() if stop else asyncio.Future())
    try:
        await asyncio.wait({job, watcher, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        stop.cancel()
        if not job.done():
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
    if job.cancelled():
        if watcher.done() and not watcher.cancelled():
            raise ClientGone()
        raise ApiError(503, SHUTTING_DOWN)
    return job.result()


def shutdown_chunk(media_type: str) -> bytes:
    """The last chunk of a stream the server's shutdown ends: an error in the stream's own shape."""
    if media_type == SSE:
        return sse({"error": {"message": SHUTTING_DOWN, "type": "unavailable_error", "param": None,
                              "code": None}}) + sse("[DONE]")
    return ndjson({"error": SHUTTING_DOWN})


class StreamResponse:
    """An ASGI response sending the chunks of `chunks` as they come, cancelled if the client leaves."""

    def __init__(self, chunks: AsyncIterator[bytes], media_type: str, on_close: Callable[[], None]):
        # on_close: cancels the engine request (a no-op once it finished); it runs even when the client left
        # before `chunks` started, whose own cleanup then never runs
        self.chunks, self.media_type, self.on_close = chunks, media_type, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await race_disconnect(receive, self._pump(send), stop=False)  # _pump ends itself at shutdown
        except ClientGone:
            pass  # nobody to answer; the engine request was cancelled with the iterator

    async def _pump(self, send: Send) -> None:
        headers = [(b"content-type", self.media_type.encode()), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]  # proxies (nginx) pass each chunk on at once
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunks = asyncio.ensure_future(self._chunks(send))
        stop = asyncio.ensure_future(lifecycle.stopping().wait())
        try:
            await asyncio.wait({chunks, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not chunks.done():  # the server stops (or the client left): the engine request ends with it
                chunks.cancel()
                await asyncio.gather(chunks, return_exceptions=True)
            self.on_close()
        if chunks.cancelled():
            await send({"type": "http.response.body", "body": shutdown_chunk(self.media_type), "more_body": True})
        else:
            chunks.result()  # what the chunks raised, raised here
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _chunks(self, send: Send) -> None:
        async with contextlib.aclosing(self.chunks) as chunks:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
