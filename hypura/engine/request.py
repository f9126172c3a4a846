"""What `Engine.submit` returns: a handle on one request, used from any thread.

The engine thread is the only writer: it emits every Event (to `on_event`, then to the handle's queue),
and sets the Result before it emits the final event. Readers block on the queue (`events()`) or on the
result (`result()`); `cancel()` only marks the request and wakes the engine, which frees the sequence
and its KV cache before its next step and emits the final event (finish_reason "cancelled").
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Callable, Iterator, Optional

from hypura.engine.types import Event, Result, SamplingParams

log = logging.getLogger("hypura.engine")
_ids = itertools.count(1)


class Request:
    def __init__(self, tokens: list[int], params: SamplingParams, on_event: Optional[Callable[[Event], None]],
                 wake: Callable[["Request"], None]):
        self.id = next(_ids)
        self.prompt = list(tokens)
        self.params = params
        self.submitted = time.perf_counter()
        self._on_event = on_event
        self._wake = wake  # tells the engine this request wants cancelling
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._done = threading.Event()
        self._result: Optional[Result] = None
        self._ended = False  # events() saw the final event
        self.cancel_requested = False

    # --- any thread -----------------------------------------------------------------------------
    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """The request's events in order, ending after the final one (finish_reason set). Raises
        TimeoutError when no event comes within `timeout` seconds."""
        while not self._ended:
            try:
                event = self._events.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no event from request {self.id} within {timeout} s") from None
            if event.finish_reason is not None:
                self._ended = True
            yield event

    def result(self, timeout: Optional[float] = None) -> Result:
        """Wait for the end; raises TimeoutError when it does not come within `timeout` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        return self._result

    def cancel(self) -> None:
        """End the request: its sequence and KV are freed before the engine's next step. No-op once done."""
        if not self._done.is_set() and not self.cancel_requested:
            self.cancel_requested = True
            self._wake(self)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    # --- the engine thread ----------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # a consumer's bug must not stop the engine: it loses its request instead
                log.exception("on_event of request %d raised; cancelling it", self.id)
                self._on_event = None
                self.cancel_requested = True
        self._events.put(event)

    def finish(self, result: Result, last_text: str = "") -> None:
        """Set the result, then emit the final event (readers woken by it find the result set)."""
        self._result = result
        self._done.set()
        self.emit(Event(text=last_text, finish_reason=result.finish_reason, error=result.error))
