"""The latest value the planner made of some inputs, kept per thread: a decision plans one model at several
contexts one after the other and reuses it, while planners on other threads (a server's loads) never see it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Latest(Generic[T]):
    def __init__(self):
        self._local = threading.local()

    def get(self, fits: Callable[[T], bool], make: Callable[[], T]) -> T:
        """This thread's latest value where `fits` accepts it, else `make()`'s, kept in its place."""
        value = getattr(self._local, "value", None)
        if value is None or not fits(value):
            value = self._local.value = make()
        return value
