"""Loads of streamed layers into their pool slots, on one loader thread.

Protocol
  The compute thread submits a layer (`Transfers.submit`, FIFO) and later waits on its `Ticket`.
  The loader thread alone reads the disk for streaming and issues copies on the copy backend (a
  second ggml backend of the GPU, so a CUDA stream of its own): neither needs a lock. Per layer:
  - RAM source (GPU pool): queue async copies pinned RAM -> slot;
  - disk source, GPU pool: read request-sized chunks with O_DIRECT into pinned staging, copy each
    to the slot, and wait for that copy before the next read reuses the staging;
  - disk source, host pool: read straight into the slot when it is plain host memory; into a
    repacking buffer type, read the whole tensor, then set it into the slot in one call;
  then record the slot's event (GPU pool) and set the ticket. `Ticket.wait()` returns once the
  bytes are in the slot: the ticket, then the event, both waited for on the host, so the stream
  that computes never waits on ours. An error in a load is raised by `wait()` on the compute thread.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from typing import Optional

from hypura.bindings.ffi import ffi, lib
from hypura.errors import HypuraError
from hypura.plan.cost import DISK
from hypura.profile.devices import first_gpu
from hypura.profile.knobs import DIRECT_ALIGN
from hypura.runtime.direct_io import DirectReader
from hypura.runtime.stream_layout import GPU_POOL

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
    pinned: object = None  # RAM source: its pinned copy
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

    def __init__(self, paths: list[str], slots: dict, gpu_disk: bool, copy_stream: bool = False):
        """slots: pool -> slot count; gpu_disk: some GPU-pool layer streams from disk; copy_stream:
        start the GPU copy stream even without GPU pool slots (expert caches make their own events)."""
        L = lib()
        self.paths = paths
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
        self._readers: dict[tuple[int, bool], DirectReader] = {}
        self._jobs: queue.Queue = queue.Queue()
        self._whole_buf: Optional[bytearray] = None
        self._thread = threading.Thread(target=self._run, name="hypura-loader", daemon=True)
        self._thread.start()

    def pinned(self, nbytes: int, what: str):
        """A buffer of pinned host memory (the GPU's host buffer type), freed with this object."""
        L = lib()
        buf = L.ggml_backend_buft_alloc_buffer(L.ggml_backend_dev_host_buffer_type(self.gpu), nbytes)
        if buf == ffi.NULL:
            raise HypuraError(f"cannot pin {nbytes / 2**30:.2f} GiB of host memory for the {what}")
        self._buffers.append(buf)
        return ffi.cast("uint8_t *", L.ggml_backend_buffer_get_base(buf))

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
            # whole tensors: pieces held back in a window did not shorten the hand-offs (H200, RESULTS.md)
            L.ggml_backend_tensor_set_async(self.backend, p.tensor, p.pinned, p.at, p.nbytes)
            return
        if pool != GPU_POOL:
            if L.ggml_backend_buffer_is_host(p.tensor.buffer):
                # ggml's own layout in plain host memory: the reads land in the slot itself (a whole-tensor
                # copy held the largest such tensor, the output head, in RAM besides its slot)
                data = ffi.cast("uint8_t *", p.tensor.data)
                self.reader(p.file_idx, staged=False).read(
                    p.file_offset, p.nbytes, lambda piece, at: ffi.memmove(data + at, ffi.from_buffer(piece), len(piece)))
                return
            # one set of the whole tensor: a repacking CPU buffer type (llama.cpp's choice for the
            # CPU, kept so the kernels and the numbers stay the default's) converts whole tensors only
            whole = self._whole(p.nbytes)
            self.reader(p.file_idx, staged=False).read(
                p.file_offset, p.nbytes, lambda piece, at: whole.__setitem__(slice(at, at + len(piece)), piece))
            L.ggml_backend_tensor_set(p.tensor, ffi.from_buffer(whole), 0, p.nbytes)
            return
        def upload(piece: memoryview, at: int) -> None:
            L.ggml_backend_tensor_set_async(self.backend, p.tensor, ffi.from_buffer(piece), at, len(piece))
            L.ggml_backend_event_record(self.staging_free, self.backend)
            L.ggml_backend_event_synchronize(self.staging_free)  # before the staging takes the next read

        self.reader(p.file_idx, staged=True).read(p.file_offset, p.nbytes, upload)

    def _whole(self, nbytes: int) -> memoryview:
        """A host buffer for one whole tensor, grown to the largest seen (the loader thread's own)."""
        if self._whole_buf is None or len(self._whole_buf) < nbytes:
            self._whole_buf = bytearray(nbytes)
        return memoryview(self._whole_buf)[:nbytes]

    def reader(self, file_idx: int, staged: bool) -> DirectReader:
        r = self._readers.get((file_idx, staged))
        if r is None:
            if file_idx >= len(self.paths):
                raise HypuraError(f"split {file_idx} of the model is not known to Hypura")
            staging = ffi.buffer(self.staging, STREAM_REQUEST_BYTES + DIRECT_ALIGN) if staged else None
            r = self._readers[(file_idx, staged)] = DirectReader(
                self.paths[file_idx], request=STREAM_REQUEST_BYTES, pread=self.pread, staging=staging)
        return r

    def close(self) -> None:
        """Finishes the loads submitted, then frees everything; safe to call twice."""
        L = lib()
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        for r in self._readers.values():
            r.close()
        self._readers.clear()
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
