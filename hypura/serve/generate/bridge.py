"""The bridge between the server's asyncio loop and the engine's thread.

Protocol, for one request:

1. `EngineStream.open` runs on the loop: it calls `engine.submit(tokens, params, on_event=...)`, which
   only queues the request (QueueFull, PromptTooLong and EngineClosed surface here, before any byte
   of the response is sent, so they become a 4xx).
2. The engine thread calls `on_event(Event)` for every event, in order. The callback does one thing:
   it posts the event to the loop's mailbox (mailbox.py), which wakes the loop once for all the events
   of a step and hands each to its stream's asyncio queue on the loop. It never blocks the engine and
   never touches asyncio state from the wrong thread. If the loop is already closed (server shutting
   down) the event is dropped.
3. The route iterates `events()` on the loop. The iterator ends after the final event (finish_reason
   set); then `result()` gives the engine's Result (durations, token counts) without waiting: the
   engine sets it before it emits the final event.
4. If the iterator is left early (the client disconnected and the response task was cancelled, or an
   exception), its `finally` calls `request.cancel()` at once. `cancel()` only marks the request and
   wakes the engine, which frees the sequence and its KV cache before its next step, so it is called
   on the loop directly. A request that already finished is not cancelled again.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Optional

from hypura.engine import Event, Result, SamplingParams
from hypura.serve.generate.mailbox import mailbox


class EngineStream:
    """One submitted request, seen from the asyncio loop."""

    def __init__(self, engine, tokens: list[int], params: SamplingParams):
        self._mailbox = mailbox()
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self.finished = False
        self.final: Optional[Event] = None
        self._started = asyncio.Event()  # the first event came: the prompt's KV is in the cache
        self.request = engine.submit(tokens, params, on_event=self._on_event)

    def _on_event(self, event: Event) -> None:  # the engine thread
        self._mailbox.post(self, event)

    def _deliver(self, event: Event) -> None:  # the loop
        self._queue.put_nowait(event)
        self._started.set()

    async def started(self) -> None:
        """Wait for the first event (requests submitted after it reuse this prompt's KV)."""
        await self._started.wait()

    async def events(self) -> AsyncIterator[Event]:
        """Every event up to and including the final one; leaving early cancels the request."""
        try:
            while not self.finished:
                event = await self._queue.get()
                if event.finish_reason is not None:
                    self.finished, self.final = True, event
                yield event
        finally:
            self.cancel()

    def cancel(self) -> None:
        if not self.finished:
            self.finished = True
            self.request.cancel()

    def result(self) -> Result:
        """The Result, once the final event was seen (set before it: no wait)."""
        return self.request.result(timeout=0)
