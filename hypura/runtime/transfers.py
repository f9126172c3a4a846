"""Loads of streamed layers into their pool slots, on one loader thread.

Protocol
  The compute thread submits a layer (`Transfers.submit`, FIFO) and later waits on its `Ticket`.
  The loader thread alone reads the disk for streaming and issues copies on the copy backend (a
  second ggml backend of the GPU, so a CUDA stream of its own): neither needs a lock. Per layer:
  - RAM source (GPU pool): queue async copies pinned RAM -> slot; (host pool, no GPU) copy it there;
  - disk source, GPU pool: read request-sized chunks with O_DIRECT into pinned staging, copy each
    to the slot, and wait for that copy before the next read reuses the staging;
  - disk source, host pool: read straight into the slot (plain host memory), a few spans at once;
  then record the slot's event (GPU pool) and set the ticket. `Ticket.wait()` returns once the
  bytes are in the slot: the ticket, then the event, both waited for on the host, so the stream
  that computes never waits on ours. An error in a load is raised by `wait()` on the compute thread.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from hypura.bindings.ffi import ffi, lib
from hypura.errors import HypuraError
from hypura.tiers.names import DISK
from hypura.profile.devices import cpu_device, first_gpu
from hypura.tiers.direct_io import DIRECT_ALIGN, DirectReader
from hypura.tiers.file_readers import FileReaders
from hypura.plan.pools import GPU_POOL, HOST_POOL

STREAM_REQUEST_BYTES = 16 << 20  # disk->GPU chunk: a read is ~10 ms at 1.5 GB/s, its copy ~0.3 ms


@dataclass
class Piece:
    """One streamed tensor: where it lives (slot tensor) and where its bytes come from."""

    name: str
    tensor: object  # struct ggml_tensor *, bound to its slot
    source: str  # RAM | DISK
    file_idx: int
    file_offset: int
    nbytes: int
    pinned: object = None  # RAM source: its bytes in the mapped file (pinned with a GPU)
    at: int = 0  # where in the tensor the bytes go (an expert's slot in a stacked slot tensor)


class Ticket:
    def __init__(self, event):
        self.done = threading.Event()
        self.event = event  # the slot's ggml_backend_event_t, NULL for the host pool
        self.error: Optional[BaseException] = None

    def wait(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error
        if self.event != ffi.NULL:
            lib().ggml_backend_event_synchronize(self.event)


class Transfers:
    pread = staticmethod(os.preadv)  # what disk reads call (tests inject faults here)

    def __init__(self, paths: list[str], slots: dict, gpu_disk: bool, copy_stream: bool = False, readers: int = 1):
        """slots: pool -> slot count; gpu_disk: some GPU-pool layer streams from disk; copy_stream:
        start the GPU copy stream even without GPU pool slots (expert caches make their own events);
        readers: concurrent disk reads of a host-pool tensor (the profile's fastest thread count)."""
        L = lib()
        self.paths = paths
        self.readers = max(1, readers)
        self._spans = ThreadPoolExecutor(self.readers - 1, thread_name_prefix="hypura-loader-reads") \
            if self.readers > 1 else None
        self.gpu = first_gpu() if slots.get(GPU_POOL) or copy_stream else None
        self.backend, self.events, self._buffers, self._own_events = ffi.NULL, {}, [], []
        if self.gpu is not None:
            self.backend = L.ggml_backend_dev_init(self.gpu, ffi.NULL)
            if self.backend == ffi.NULL:
                raise HypuraError("cannot start a copy stream on the GPU")
            for slot in range(slots.get(GPU_POOL, 0)):
                self.events[slot] = L.ggml_backend_event_new(self.gpu)
        self.staging = self.pinned(STREAM_REQUEST_BYTES + DIRECT_ALIGN, "disk staging") if gpu_disk else None
        self.staging_free = L.ggml_backend_event_new(self.gpu) if gpu_disk else ffi.NULL
        staging = ffi.buffer(self.staging, STREAM_REQUEST_BYTES + DIRECT_ALIGN) if gpu_disk else None
        # (staged, k): into the pinned staging; else reader k of the spans read at once, each into its own buffer
        self._readers = {(True, 0): FileReaders(paths, STREAM_REQUEST_BYTES, staging),
                         **{(False, k): FileReaders(paths, STREAM_REQUEST_BYTES) for k in range(self.readers)}}
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="hypura-loader", daemon=True)
        self._thread.start()

    def pinned(self, nbytes: int, what: str):
        """A buffer of pinned host memory (the GPU's host buffer type), freed with this object."""
        return self.host_buffer(nbytes, what)[1]

    def host_buffer(self, nbytes: int, what: str):
        """(ggml buffer, its first byte) of host memory freed with this object: pinned (the GPU's host buffer
        type) with a GPU, plain without."""
        L = lib()
        buft = L.ggml_backend_dev_host_buffer_type(self.gpu) if self.gpu is not None else _cpu_buffer_type()
        buf = L.ggml_backend_buft_alloc_buffer(buft, nbytes)
        if buf == ffi.NULL:
            raise HypuraError(f"cannot {'pin' if self.gpu is not None else 'allocate'} {nbytes / 2**30:.2f} GiB "
                              f"of host memory for the {what}")
        self._buffers.append(buf)
        return buf, ffi.cast("uint8_t *", L.ggml_backend_buffer_get_base(buf))

    def submit(self, pool: str, slot: int, pieces: list[Piece]) -> Ticket:
        return self.submit_with(self.events[slot] if pool == GPU_POOL else ffi.NULL, pool, pieces)

    def submit_with(self, event, pool: str, pieces: list[Piece]) -> Ticket:
        """Load `pieces`, then record `event` (NULL: none) on the copy stream; FIFO with submit()."""
        ticket = Ticket(event)
        self._jobs.put((pool, ticket, pieces))
        return ticket

    def new_event(self):
        """An event of the copy stream's GPU, freed with this object."""
        ev = lib().ggml_backend_event_new(self.gpu)
        self._own_events.append(ev)
        return ev

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            pool, ticket, pieces = job
            try:
                for p in pieces:
                    self._load(pool, p)
                if ticket.event != ffi.NULL:
                    lib().ggml_backend_event_record(ticket.event, self.backend)
            except BaseException as e:  # handed to the compute thread: never lost here
                ticket.error = e
            ticket.done.set()

    def _load(self, pool: str, p: Piece) -> None:
        L = lib()
        if p.source != DISK:
            if pool == HOST_POOL:  # a RAM tensor some steps stream through a host slot (no GPU to stream to)
                ffi.memmove(ffi.cast("uint8_t *", L.ggml_get_data(p.tensor)) + p.at, p.pinned, p.nbytes)
                return
            # whole tensors: pieces held back in a window did not shorten the hand-offs (H200, RESULTS.md)
            L.ggml_backend_tensor_set_async(self.backend, p.tensor, p.pinned, p.at, p.nbytes)
            return
        if pool != GPU_POOL:
            # ggml's plain layout in host memory (the runtime turns repacking off beside host-pool slots): the
            # reads land in the slot itself (a whole-tensor copy held the largest one, the output head, beside it)
            data = ffi.cast("uint8_t *", L.ggml_get_data(p.tensor))
            if data == ffi.NULL:
                raise HypuraError("a host-pool slot has no memory to read into")
            self._read_spans(p, lambda at, piece: ffi.memmove(data + at, ffi.from_buffer(piece), len(piece)))
            return
        def upload(piece: memoryview, at: int) -> None:
            L.ggml_backend_tensor_set_async(self.backend, p.tensor, ffi.from_buffer(piece), at, len(piece))
            L.ggml_backend_event_record(self.staging_free, self.backend)
            L.ggml_backend_event_synchronize(self.staging_free)  # before the staging takes the next read

        self.reader(p.file_idx, staged=True).read(p.file_offset, p.nbytes, upload)

    def _read_spans(self, p: Piece, write) -> None:
        """The tensor's bytes, write(offset, piece), as `readers` spans read at once: a disk serves a few
        streams faster than one (CPU VM: 0.92 GB/s with one reader, 1.64 with two)."""
        n = self.readers if p.nbytes >= self.readers * STREAM_REQUEST_BYTES else 1
        span = -(-p.nbytes // n)

        def read(k: int) -> None:
            base = k * span
            self.reader(p.file_idx, staged=False, k=k).read(
                p.file_offset + base, min(span, p.nbytes - base), lambda piece, at: write(base + at, piece))

        others = [self._spans.submit(read, k) for k in range(1, n)]
        try:
            read(0)
        finally:
            errors = [f.exception() for f in others]  # every span lands before its buffer is reused
        for e in errors:
            if e is not None:
                raise e

    def reader(self, file_idx: int, staged: bool, k: int = 0) -> DirectReader:
        return self._readers[(staged, k)].get(file_idx, pread=self.pread)

    def close(self) -> None:
        """Finishes the loads submitted, then frees everything; safe to call twice."""
        L = lib()
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        if self._spans is not None:
            self._spans.shutdown(wait=True)
        for readers in self._readers.values():
            readers.close()
        if self.backend != ffi.NULL:
            L.ggml_backend_synchronize(self.backend)
        for ev in [*self.events.values(), *self._own_events, self.staging_free]:
            if ev != ffi.NULL:
                L.ggml_backend_event_free(ev)
        self.events.clear()
        self._own_events.clear()
        self.staging_free = ffi.NULL
        for buf in self._buffers:
            L.ggml_backend_buffer_free(buf)
        self._buffers.clear()
        if self.backend != ffi.NULL:
            L.ggml_backend_free(self.backend)
            self.backend = ffi.NULL


def _cpu_buffer_type():
    cpu = cpu_device()
    if cpu is None:
        raise HypuraError("llama.cpp has no CPU device")
    return lib().ggml_backend_dev_buffer_type(cpu)
