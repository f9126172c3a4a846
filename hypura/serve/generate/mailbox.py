"""Events from engine threads to one asyncio loop, with one wake-up per batch and the GIL kept while waking.

Protocol:

- An engine thread calls `post(stream, event)`: the pair goes into a list under a lock; only the post that
  finds the list empty wakes the loop, by writing one byte to a pipe the loop reads (`loop.add_reader`).
  A step's events come together (the engine delivers them right before its next llama_decode), so the
  loop is woken once a step whatever the number of streams.
- The byte is written by libc's `write` called through `ctypes.PyDLL`, which keeps the GIL. Any call that
  releases it (`os.write`, `call_soon_threadsafe`'s socket send) lets the woken loop take the GIL at once
  and run every stream's response while the engine thread waits for it (0.5-0.7 ms a step, ~3 % of a
  one-client SmolLM2-135M decode step on 2 shared cores); held, the loop waits until the engine enters
  llama_decode, which releases the GIL for the whole computation.
- The loop's reader (`_drain`) empties the pipe first, then takes the list under the lock and puts each
  event into its stream's asyncio queue. Reading before taking makes sure a post that found the list
  empty after the take always has its byte seen.
- A loop that is closed is never woken again; its pipe is closed when the mailbox is collected.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
import weakref
from typing import Callable, Optional

from hypura.engine import Event


def _gil_holding_write() -> Optional[Callable[[int, bytes, int], int]]:
    try:
        write = ctypes.PyDLL(None).write  # PyDLL: the call keeps the GIL
    except (OSError, AttributeError, TypeError):  # no libc symbols in this process (not Linux/macOS)
        return None
    write.argtypes, write.restype = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t), ctypes.c_ssize_t
    return write


_WRITE = _gil_holding_write()


class Mailbox:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._lock = threading.Lock()
        self._items: list[tuple[object, Event]] = []
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        loop.add_reader(self._read, self._drain)
        weakref.finalize(self, _close, self._read, self._write)

    def post(self, stream, event: Event) -> None:
        """From an engine thread: `stream._deliver(event)` runs on the loop, in posting order."""
        with self._lock:
            self._items.append((stream, event))
            if len(self._items) > 1:  # a wake-up is already on its way and this one rides with it
                return
        try:
            if _WRITE is not None:
                _WRITE(self._write, b"\0", 1)
            else:
                os.write(self._write, b"\0")
        except OSError:  # the pipe is full (a wake-up is pending) or closed (the loop is gone)
            pass

    def _drain(self) -> None:
        try:
            os.read(self._read, 4096)
        except BlockingIOError:
            pass
        with self._lock:
            items, self._items = self._items, []
        for stream, event in items:
            stream._deliver(event)


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


_MAILBOXES: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox]" = weakref.WeakKeyDictionary()


def mailbox() -> Mailbox:
    """The running loop's mailbox (made on its first use, on the loop)."""
    loop = asyncio.get_running_loop()
    box = _MAILBOXES.get(loop)
    if box is None:
        box = _MAILBOXES[loop] = Mailbox(loop)
    return box
