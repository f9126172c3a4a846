"""A load's fills of host memory, read from the model file on a few threads beside llama.cpp's load.

One thread reading a cached file into pinned memory copies at a few GB/s; the pinned CPU weights of a plan
(15.4 GiB of q3's experts, 36.7 GiB of l70's streamed layers' copies) then take most of a load. Their bytes go
where the loader hooks say, in host memory that stays put, so they need not be read in the hook itself.

Protocol
  `LoadFills(paths, cached, threads)` serves one load. On the loader's thread, inside a fill hook,
  `read_into(info, dest)` queues the tensor's bytes for host memory at `dest` (a cffi pointer) in pieces of
  PIECE_BYTES and returns at once; `threads` workers read them, each through readers of its own (an O_DIRECT
  reader stages through a buffer of its own), into disjoint ranges. Nothing may read or free that memory until
  `wait()`: the loader's thread calls it after llama.cpp's load returned, before anything computes; it blocks
  until every piece is read and raises the first read's error. `close()` waits as well, drops errors (the
  load has failed already) and closes the readers; no `read_into` after it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from hypura.bindings.ffi import ffi
from hypura.tiers.file_readers import FileReaders

# large enough that a piece's read dwarfs its queueing, small enough that a few tensors keep every thread busy
PIECE_BYTES = 64 << 20
# reads through the page cache are copies, which scale with threads toward RAM's bandwidth (one thread is far from
# it); at most this many, and no more than the machine's cores (bench/pin_probe.py measures fill-1 and fill-8)
CACHED_THREADS = 8


class LoadFills:
    def __init__(self, paths: list[str], cached: bool, threads: int):
        self.paths, self.cached = paths, cached
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="hypura-load-fill")
        self._local = threading.local()
        self._readers: list[FileReaders] = []
        self._lock = threading.Lock()  # guards _readers (each worker adds its own once)
        self._pending: list[Future] = []

    def read_into(self, info, dest) -> None:
        """Queue the tensor's bytes (info: runtime.placement.TensorInfo) for host memory at `dest`."""
        base = int(ffi.cast("uintptr_t", dest))
        for at in range(0, info.nbytes, PIECE_BYTES):
            n = min(PIECE_BYTES, info.nbytes - at)
            self._pending.append(self._pool.submit(self._read, info.file_idx, info.file_offset + at, n, base + at))

    def _read(self, file_idx: int, offset: int, nbytes: int, address: int) -> None:
        readers = getattr(self._local, "readers", None)
        if readers is None:
            readers = self._local.readers = FileReaders(self.paths, cached=self.cached)
            with self._lock:
                self._readers.append(readers)
        view = memoryview(ffi.buffer(ffi.cast("uint8_t *", address), nbytes))
        readers.get(file_idx).read_into(offset, nbytes, view)

    def wait(self) -> None:
        """Every queued piece read; the first error raised."""
        pending, self._pending = self._pending, []
        first = None
        for f in pending:
            error = f.exception()
            first = first or error
        if first is not None:
            raise first

    def close(self) -> None:
        try:
            self.wait()
        except Exception:  # noqa: BLE001  (the load failed: its caller raises why)
            pass
        self._pool.shutdown(wait=True)
        for readers in self._readers:
            readers.close()
        self._readers.clear()
