"""What ends the server's work: its shutdown, the prompt work of a request, a connection that never sends
its headers.

Protocol:

1. Shutdown. uvicorn's shutdown (SIGTERM, Ctrl-C, `Server.stop()`) first calls `begin_shutdown()` on the
   server's loop; that sets the loop's `stopping()` event. Every open stream (streaming.StreamResponse) and
   every wait for a whole result (streaming.race_disconnect) watches it: a stream sends its final error
   chunk (SSE: then `data: [DONE]`) and ends, a wait answers 503. So the connections finish well within
   uvicorn's grace period and nothing is left for it to cancel.
2. Prompt work (rendering a chat template, tokenizing) runs through `off_loop(fn)`: `fn(cancelled)` on a
   daemon thread of its own, never the loop's default executor (which asyncio joins when the loop closes:
   shutdown would wait on it). The awaiting request sets `cancelled` when it is cancelled (its deadline),
   its client disconnects (the guard hands each request's `receive` over in a context variable: the body
   is read by then, so what comes is the disconnect) or the server stops; `fn` checks it between its
   bounded steps. `drain(seconds)` waits for the threads
   still running, so the models are closed only when no thread uses them.
3. Headers. `HeaderDeadline`, uvicorn's h11 protocol with a deadline: a connection whose request headers
   are not complete `timeout` seconds after it opened (or after its previous response, whose body may
   still be dripping in unread) is closed, one log line each (slowloris). A body being read has its own
   deadline (guard.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
import weakref
from typing import Callable, TypeVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from hypura.serve.http.errors import ApiError

T = TypeVar("T")
log = logging.getLogger("hypura.serve")

_STOPPING: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event]" = weakref.WeakKeyDictionary()
_WORKERS: set[threading.Thread] = set()
_RECEIVE: contextvars.ContextVar = contextvars.ContextVar("hypura_serve_receive", default=None)


class ClientGone(Exception):
    """The client disconnected before the work was done."""


def watch_client(receive) -> None:
    """Let off_loop work of this request (this task and its children) stop when its client disconnects."""
    _RECEIVE.set(receive)


async def disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
_WORKERS_LOCK = threading.Lock()


def stopping() -> asyncio.Event:
    """The running loop's shutdown event (set once the server starts shutting down)."""
    loop = asyncio.get_running_loop()
    event = _STOPPING.get(loop)
    if event is None:
        event = _STOPPING[loop] = asyncio.Event()
    return event


def begin_shutdown() -> None:
    stopping().set()


async def off_loop(fn: Callable[[threading.Event], T], deadline_s: float) -> T:
    """`fn(cancelled)` on a daemon thread. Its deadline passing or its client leaving sets `cancelled`, and
    the caller then waits for `fn` to stop (its current step: the model it reads stays leased until then)
    before raising ApiError 500 / ClientGone; the server stopping raises ApiError 503 at once (`drain`)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    cancelled = threading.Event()

    def settle(ok: bool, value) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def run() -> None:
        try:
            result = (True, fn(cancelled))
        except BaseException as e:  # noqa: BLE001 (handed to the awaiting request as it is)
            result = (False, e)
        finally:
            with _WORKERS_LOCK:
                _WORKERS.discard(threading.current_thread())
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:  # the loop closed meanwhile: nobody waits for the result
            pass

    thread = threading.Thread(target=run, name="hypura-serve-prompt", daemon=True)
    with _WORKERS_LOCK:
        _WORKERS.add(thread)
    thread.start()
    stop = asyncio.ensure_future(stopping().wait())
    receive = _RECEIVE.get()
    gone = asyncio.ensure_future(disconnected(receive) if receive else asyncio.Future())
    try:
        await asyncio.wait({future, stop, gone}, timeout=deadline_s, return_when=asyncio.FIRST_COMPLETED)
        if not future.done():
            cancelled.set()
            if not stop.done():
                await asyncio.wait({future, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stop.done():
                raise ApiError(503, "the server is shutting down")
            if gone.done():
                raise ClientGone()
            raise ApiError(500, f"preparing the prompt took longer than {deadline_s:g} s")
        return future.result()
    finally:
        cancelled.set()  # a no-op once fn returned; else (the caller cancelled) fn stops at its next step
        stop.cancel()
        gone.cancel()


def drain(seconds: float) -> bool:
    """Wait up to `seconds` for every off_loop thread to end; False if some still run."""
    deadline = time.monotonic() + seconds
    while True:
        with _WORKERS_LOCK:
            alive = [t for t in _WORKERS if t.is_alive()]
        if not alive:
            return True
        if time.monotonic() > deadline:
            return False
        alive[0].join(min(0.1, max(0.0, deadline - time.monotonic())))


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers take longer than `timeout_s`."""

    def __init__(self, *args, timeout_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout_s = timeout_s
        self._header_timer = None

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _serving(self) -> bool:
        """A request's headers are in and its response is not complete."""
        return self.cycle is not None and not self.cycle.response_complete

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and not self._serving():  # also the rest of an unread body
            client = "%s:%d " % tuple(self.client[:2]) if self.client else ""
            log.info("%sclosed: no complete request headers within %g s (--timeout)", client, self.header_timeout_s)
            self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._serving():  # the headers are in: the body's deadline is the guard's
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # the next request's headers (or what is left of a body nobody read), kept alive
        super().on_response_complete()
        if self._serving():  # a pipelined request started at once
            self._disarm()
