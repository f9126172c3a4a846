"""Reads of many file ranges that keep the disk busy while the caller copies what has landed.

A reader thread that also copies its bytes out of the staging buffer and faults in their destination
leaves the disk idle meanwhile: with the two readers a disk serves best, ~1 MB expert slices read at
0.6 of the disk's rate on the H200 (2026-12-03). Here the readers only read, and the caller's thread
does the rest between landings.

Protocol
  - `run(parts, before_first)` cuts each part (a TensorInfo range and a sink) into requests of at
    most the reader's request size and submits them all to `readers` threads.
  - A reader thread takes a free stager (a staging buffer with a DirectReader per file reading into
    it) from a pool of STAGERS_PER_READER x readers, blocking while none is free, reads one request
    into it, and puts (request, stager, where the bytes lie) on the done queue, or the error and the
    stager back.
  - Once all are submitted, the caller runs `meanwhile` (the pager evicts there, while the disk reads);
    no before_first runs until it returned (the pager faults a slice in only once room is made).
  - The caller's thread takes every request's result off the done queue in completion order: before
    a part's first piece it calls before_first(part index) (the pager faults the slice in there), then
    hands the bytes to the part's sink (pieces of a part may arrive out of order, each with its
    position) and gives the stager back.
  - With `preparers` threads, run() instead submits before_first for every part, in order, to them at
    once; the caller only waits for part i's before its first piece. So faulting in runs ahead on spare
    cores while the caller copies. run() returns only after every submitted one finished.
  - So a reader waits only when the caller is that many requests behind. Every request reports once,
    so run() returns (or raises the first error) only after all readers let go of their stagers: none
    is left writing into a buffer the caller reuses.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Optional

from hypura.tiers.direct_io import DIRECT_ALIGN, DISK_REQUEST_BYTES, DirectReader, DiskReadError, aligned_buffer
from hypura.tiers.file_readers import FileReaders
from hypura.runtime.placement import TensorInfo

Sink = Callable[[memoryview, int], None]  # (piece, position in the part)
STAGERS_PER_READER = 4  # staged requests a reader may run ahead of the caller's copies


class _Stager:
    """One staging buffer and, per file, a reader that reads into it (opened on first use)."""

    def __init__(self, paths: list[str], request: int):
        self.buf = aligned_buffer(request + DIRECT_ALIGN)
        self.readers = FileReaders(paths, request, staging=self.buf)

    def reader(self, file_idx: int) -> DirectReader:
        return self.readers.get(file_idx)

    def close(self) -> None:
        self.readers.close()
        self.buf.close()


class ReadPipeline:
    def __init__(self, paths: list[str], readers: int, request: int = DISK_REQUEST_BYTES, preparers: int = 0):
        """preparers: threads that run before_first ahead of the copies (0: the caller runs it)."""
        self.readers = max(1, readers)
        self.request = request
        self._threads = ThreadPoolExecutor(self.readers, thread_name_prefix="hypura-reads")
        self._preparers = ThreadPoolExecutor(preparers, thread_name_prefix="hypura-prepare") if preparers > 0 else None
        self._stagers = [_Stager(paths, request) for _ in range(STAGERS_PER_READER * self.readers)]
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for s in self._stagers:
            self._free.put(s)

    def run(self, parts: list[tuple[TensorInfo, Sink]], before_first: Optional[Callable[[int], None]] = None,
            meanwhile: Optional[Callable[[], None]] = None) -> None:
        """Read every part's bytes into its sink; before_first(i) runs on this thread before part i's first piece
        (or on the preparers), meanwhile() on this thread once every request is submitted, before any is copied
        and before any before_first."""
        done: queue.SimpleQueue = queue.SimpleQueue()
        cleared = threading.Event()  # set once meanwhile() returned (or raised)
        if meanwhile is None:
            cleared.set()

        def prepare(i: int) -> None:
            cleared.wait()
            before_first(i)

        ready = ([self._preparers.submit(prepare, i) for i in range(len(parts))]
                 if before_first is not None and self._preparers is not None else None)
        n = 0
        for i, (info, sink) in enumerate(parts):
            for pos in range(0, info.nbytes, self.request):
                self._threads.submit(self._read_one, info, pos, min(self.request, info.nbytes - pos), i, done)
                n += 1
        error, received, started = None, 0, set()
        try:
            if meanwhile is not None:  # the disk is busy already; an error still lets every request report
                try:
                    meanwhile()
                finally:
                    cleared.set()
            while received < n:
                i, pos, stager, skip, got, failed = done.get()
                received += 1
                if failed is not None:
                    error = error or failed
                    continue
                try:
                    if error is None:
                        if i not in started:
                            started.add(i)
                            if ready is not None:
                                ready[i].result()
                            elif before_first is not None:
                                before_first(i)
                        with memoryview(stager.buf) as view:
                            parts[i][1](view[skip:skip + got], pos)
                except BaseException as e:
                    error = e
                finally:
                    self._free.put(stager)
        finally:
            while received < n:  # interrupted (KeyboardInterrupt): every stager still comes back
                stager = done.get()[2]
                received += 1
                if stager is not None:
                    self._free.put(stager)
            if ready is not None:  # none may still touch a slice the caller evicts next
                wait(ready)
        if error is not None:
            raise error

    def _read_one(self, info: TensorInfo, pos: int, want: int, part: int, done: queue.SimpleQueue) -> None:
        stager = self._free.get()
        try:
            skip, got = self._stage(stager, info, pos, want)
            done.put((part, pos, stager, skip, got, None))
        except BaseException as e:
            self._free.put(stager)
            done.put((part, pos, None, 0, 0, e))

    @staticmethod
    def _stage(stager: _Stager, info: TensorInfo, pos: int, want: int) -> tuple[int, int]:
        """Read `want` bytes at `pos` of the part into the stager: (where they start in its buffer, count)."""
        reader = stager.reader(info.file_idx)
        if pos == 0:
            reader.check_range(info.file_offset, info.nbytes)
        skip, got = reader.stage(info.file_offset + pos, want)
        if got != want:
            raise DiskReadError(f"{info.name}: {want} bytes at {info.file_offset + pos} came up short")
        return skip, got

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        if self._preparers is not None:
            self._preparers.shutdown(wait=True)
        for s in self._stagers:
            s.close()
