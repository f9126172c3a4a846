"""Responses that end when the client goes away: NDJSON and SSE streams, and waits for a whole result.

Both watch the connection with a task that reads ASGI `receive()` until `http.disconnect` (the body
was read before, so nothing else arrives; uvicorn answers `http.disconnect` once the response is
complete too). When the client disconnects first, the work is cancelled: the `EngineStream.events()`
iterator is closed, which cancels the engine request and frees its sequence and KV cache at once,
instead of decoding for nobody until max_tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from starlette.types import Receive, Scope, Send

T = TypeVar("T")

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


def ndjson(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def sse(obj) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


class ClientGone(Exception):
    """The client disconnected before the work was done."""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def race_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """`await work`, or cancel it and raise ClientGone if the client disconnects first.

    The work runs as a task of its own beside the watcher, so its exceptions reach the caller as they
    are; a cancelled work has finished its cleanup (closing its event iterator) when this returns."""
    job, watcher = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not job.done():
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
    if job.cancelled():
        raise ClientGone()
    return job.result()


class StreamResponse:
    """An ASGI response sending the chunks of `chunks` as they come, cancelled if the client leaves."""

    def __init__(self, chunks: AsyncIterator[bytes], media_type: str, on_close: Callable[[], None]):
        # on_close: cancels the engine request (a no-op once it finished); it runs even when the client left
        # before `chunks` started, whose own cleanup then never runs
        self.chunks, self.media_type, self.on_close = chunks, media_type, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await race_disconnect(receive, self._pump(send))
        except ClientGone:
            pass  # nobody to answer; the engine request was cancelled with the iterator

    async def _pump(self, send: Send) -> None:
        headers = [(b"content-type", self.media_type.encode()), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]  # proxies (nginx) pass each chunk on at once
        try:
            async with contextlib.aclosing(self.chunks) as chunks:
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            self.on_close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
