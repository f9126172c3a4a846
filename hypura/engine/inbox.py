"""What other threads hand the engine: requests, cancellations, closing; and the counters they read back.

One Condition (`lock`) guards everything here: the waiting queue, the requests cancelled before a slot, the
preempted sequences waiting again (admission.py), the closing flag, why the loop stopped, and the engine's
counters. Other threads hold it for bookkeeping only:

- `put()` (Engine.submit, any thread) appends a request (QueueFull beyond max_queue) and wakes the loop;
  `cancel()` (Request.cancel, any thread) takes a request that still waits out of the queue and wakes the
  loop; `close()` sets the closing flag and wakes it; `snapshot()` (Engine.metrics) reads the counts and the
  queue in one hold, so that an idle engine never shows a request that has not been counted finished.
- `between_steps()` gives another thread (Engine.metrics, Engine.embed) the step lock: it counts itself a
  waiter, and the loop waits at its top (`next()`) until no one waits, since a lock released and taken again
  at once by the same thread is not handed over (POSIX semaphores), and a reader would starve.
- The engine thread sleeps in `next()` while nothing waits, runs or was cancelled, then takes the cancelled
  requests and, without kv_unified, as many waiting ones as slots are free; with kv_unified the scheduler
  serves the queue's head itself, under `lock`, holding the step lock. It updates the counters under
  `lock`, and `requeue()`s a preempted sequence at the queue's front.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Optional

from hypura.engine.metrics import Counters, places
from hypura.engine.request import Request
from hypura.engine.types import EngineClosed, QueueFull


class Inbox:
    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.lock = threading.Condition()
        self.waiting: collections.deque[Request] = collections.deque()
        self.cancelled: list[Request] = []  # left the queue before a slot: the engine thread ends them
        self.preempted: dict = {}  # Request -> its Sequence, waiting again to be recomputed (admission.py)
        self.counters = Counters()
        self.closing = False
        self.stopped: Optional[str] = None  # why the loop ended (None while it may run)
        self._lock_waiters = 0  # other threads waiting for the step lock (metrics, embed): the loop lets them in

    # --- any thread -----------------------------------------------------------------------------
    def put(self, request: Request) -> None:
        with self.lock:
            if self.closing or self.stopped:
                raise EngineClosed("the engine was closed" if self.closing else f"the engine stopped: {self.stopped}")
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"{len(self.waiting)} requests wait already (max_queue {self.max_queue})")
            self.waiting.append(request)
            self.counters.submitted += 1
            self.lock.notify()

    def cancel(self, request: Request) -> None:
        with self.lock:
            if request in self.waiting:
                self.waiting.remove(request)
                self.cancelled.append(request)
            self.lock.notify()

    def close(self) -> bool:
        """Ask the loop to end; False when it was asked already."""
        with self.lock:
            if self.closing:
                return False
            self.closing = True
            self.lock.notify()
            return True

    def snapshot(self) -> dict:
        """The counters, with the active requests (out of the queue, not finished) and the queue's places;
        the caller holds `lock` (to read more in the same hold)."""
        queued = len(self.waiting)
        active = self.counters.submitted - sum(self.counters.finished.values()) - queued
        return self.counters.as_dict(active, queued) | {"queue": places(self.waiting, self.preempted)}

    @contextlib.contextmanager
    def between_steps(self, step_lock: threading.RLock):
        """`step_lock` for a thread other than the loop's (above)."""
        with self.lock:
            self._lock_waiters += 1
        try:
            step_lock.acquire()
        finally:
            with self.lock:
                self._lock_waiters -= 1
                self.lock.notify_all()
        try:
            yield
        finally:
            step_lock.release()

    # --- the engine thread ----------------------------------------------------------------------
    def next(self, busy: bool, free_slots: Optional[int]) -> Optional[tuple[list[Request], list[Request]]]:
        """Wait for work (`busy`: sequences run), then (cancelled requests, requests to admit: up to
        `free_slots`; None: kv_unified, the scheduler serves the queue); None once closing."""
        with self.lock:
            while not (self.closing or self.waiting or busy or self.cancelled) or \
                    (self._lock_waiters and not self.closing):
                self.lock.wait()
            if self.closing:
                return None
            cancelled, self.cancelled = self.cancelled, []
            n = 0 if free_slots is None else min(free_slots, len(self.waiting))
            return cancelled, [self.waiting.popleft() for _ in range(n)]

    def resumed(self, request: Request):
        """The Sequence a preempted request left (it is recomputed now), or None."""
        with self.lock:
            return self.preempted.pop(request, None)

    def requeue(self, request: Request, seq) -> None:
        """A preempted sequence waits at the queue's front."""
        with self.lock:
            self.preempted[request] = seq
            self.waiting.appendleft(request)
            self.counters.preempted += 1

    def drain(self) -> list[Request]:
        """Every request still waiting or cancelled, out of the queue (the loop ended)."""
        with self.lock:
            waiting = list(self.waiting) + self.cancelled
            self.waiting.clear()
            self.cancelled = []
        return waiting

    def count_finish(self, reason: str) -> None:
        with self.lock:
            self.counters.finished[reason] += 1
