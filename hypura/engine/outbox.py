"""What the engine hands back: a step's events and results, posted while it runs and delivered together.

Engine thread only. Sequences post their events as they sample (sequence.py) and finished requests their
results (scheduler.py); `deliver()` emits them in order, outside every lock, at one of two moments: right
before the next step's llama_decode (runner.py), so that a consumer they wake (the server's loop) runs while
that decode holds no GIL instead of taking it in the middle of the step's Python work; or, when no step
follows, before the loop sleeps (engine.py).
"""

from __future__ import annotations

import functools
from typing import Callable

from hypura.engine.request import Request
from hypura.engine.types import Event, Result


class Outbox:
    def __init__(self):
        self._posted: list[Callable[[], None]] = []

    def post(self, request: Request, event: Event) -> None:
        self._posted.append(functools.partial(request.emit, event))

    def finish(self, request: Request, result: Result, last_text: str = "") -> None:
        self._posted.append(functools.partial(request.finish, result, last_text))

    def deliver(self) -> None:
        """Emit what was posted since the last delivery, in order."""
        posted, self._posted = self._posted, []
        for emit in posted:
            emit()
