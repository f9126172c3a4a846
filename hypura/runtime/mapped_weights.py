"""A plan's RAM weights at home in the page cache: the model file mapped read-only, and the weights the GPU copies
(op offload's CPU weights, the layer streamer's RAM sources) pinned where they lie.

Pinned memory allocated with cudaHostAlloc came at 2.7 GB/s on the H200 host (bench/pin_probe.py): l70's 36.7 GiB
of streamed layers took 13.7 s of its load before a byte was read. Registering the cached file's own pages pinned
8 GiB in 0.33 s (25.9 GB/s), with no copy and no second copy in RAM, and the GPU read them at the same 55 GB/s.
Only the weights' pages are touched, so the process holds what the plan counts, nothing more of the file.

Protocol
  `MappedWeights(paths, prefetch, threads)` serves one model, built before its load. During the load, on the
  loader's thread, `home(info)` answers a weight's address in the mapping (a cffi `uint8_t *`) and notes its
  range to pin; `rehome(tensor, info)` moves a deferred tensor's data there for good (the stream's home
  mechanism, include/hypura.h "Per-step paths", with no slot). After llama.cpp's load returns and before
  anything computes, the loader's thread calls `pin()`: the noted ranges, merged and cut in pieces, are read
  into the cache on `threads` workers where `prefetch` (a cold file: pages read in parallel, not faulted one by
  one) and registered with the GPU; it returns when all are, and warns once if the GPU refused some (they stay
  pageable: slower copies, the same results). `check()` before and after each decode raises once a file changed
  in place. `close()` after the model and its contexts are freed:
  unregisters, frees the buffers, unmaps.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hypura.bindings.ffi import ffi, lib
from hypura.errors import HypuraError, ModelFileError
from hypura.profile.devices import cpu_device, first_gpu
from hypura.tiers.file_readers import FileReaders
from hypura.tiers.residency import map_read_only, unmap

# a registration and a prefetch read of this size keep eight threads busy on a few layers; small beside
# cudaHostRegister's per-call cost (tens of microseconds)
PIECE_BYTES = 64 << 20
# ranges this close merge into one: the norms between a layer's matrices are a few KiB
MERGE_GAP = 1 << 20
READ_BYTES = 16 << 20  # one prefetch read: the scratch each worker reads into
# registrations of cached pages at once: the kernel pins each page, work that spreads over cores
PIN_THREADS = 8
# "0": the mapped weights stay pageable, as llama.cpp's mmap leaves them (the GPU copies them at pageable speed);
# else their pages are registered with the GPU (pinned). Read once, at import
PIN_SETTING = "HYPURA_PIN_MAPPED"
PIN_MAPPED = os.environ.get(PIN_SETTING, "1") != "0"


@dataclass(frozen=True)
class PinStats:
    nbytes: int
    seconds: float
    refused: int  # bytes the GPU did not register (left pageable)
    registered: bool  # with a GPU: its pages registered (pinned); else only mapped (and read in where cold)

    @property
    def line(self) -> str:
        rate = f", {self.nbytes / self.seconds / 1e9:.1f} GB/s" if self.seconds > 0 else ""
        refused = f"; {self.refused / 2**30:.1f} GiB refused, left pageable" if self.refused else ""
        how = "pinned" if self.registered else "mapped"
        return (f"hypura: load: {self.nbytes / 2**30:.1f} GiB of weights {how} in the page cache in "
                f"{self.seconds:.2f} s{rate}{refused}")


class MappedWeights:
    def __init__(self, paths: list[str], prefetch: bool, threads: int):
        self.paths, self.prefetch, self.threads = paths, prefetch, max(1, threads)
        self._maps: list[tuple[int, int]] = []  # (address, size) per file
        self._buffers: list = [None] * len(paths)  # a CPU buffer over each mapping, made when first asked
        self._ranges: list[tuple[int, int, int]] = []  # (file, offset, nbytes) to pin
        self._registered: list[int] = []  # piece addresses, to unregister
        self._stream = None  # the C stream that re-homes deferred tensors
        self._callbacks = None
        self._files: list[tuple[int, int, int]] = []  # (descriptor, size, mtime) per file, watched by check()
        self.stats: PinStats | None = None
        try:
            for path in paths:
                try:
                    self._files.append(_stamp(os.open(path, os.O_RDONLY)))
                    self._maps.append(map_read_only(path))
                except OSError as e:
                    raise HypuraError(f"cannot map {path}: {e.strerror}") from None
                if not self._maps[-1][0]:
                    raise HypuraError(f"cannot map {path} into memory")
        except BaseException:
            self.close()  # the files mapped before this one
            raise

    # --- during the load ------------------------------------------------------------------------
    def home(self, info):
        """The weight's bytes in the mapping (info: runtime.placement.TensorInfo), noted to be pinned."""
        addr, size = self._maps[info.file_idx]
        if info.file_offset + info.nbytes > size:
            raise HypuraError(f"tensor '{info.name}' lies past the end of its file: the model file is truncated")
        self._ranges.append((info.file_idx, info.file_offset, info.nbytes))
        return ffi.cast("uint8_t *", addr + info.file_offset)

    def buffer(self, file_idx: int):
        """A plain CPU buffer over file `file_idx`'s mapping (what a weight at home there belongs to)."""
        if self._buffers[file_idx] is None:
            addr, size = self._maps[file_idx]
            buf = lib().ggml_backend_dev_buffer_from_host_ptr(cpu_device(), ffi.cast("void *", addr), size, size)
            if buf == ffi.NULL:
                raise HypuraError("llama.cpp's CPU backend cannot compute from a mapped model file")
            self._buffers[file_idx] = buf
        return self._buffers[file_idx]

    def rehome(self, tensor, info) -> None:
        """A deferred tensor's data moves to its bytes in the mapping, where the CPU computes it and op offload
        copies it from."""
        L = lib()
        if self._stream is None:
            noop = ffi.callback("hypura_unit_fn", lambda unit, user_data: 0)
            self._callbacks = noop  # alive while C holds it (never called: the stream is no context's cb_eval)
            self._stream = L.hypura_stream_new(ffi.new("struct hypura_stream_hooks *", {"before": noop, "after": noop}))
        unit = len(self._ranges)  # a unit of its own: at most 64 weights a unit
        data = self.home(info)
        if (L.hypura_stream_add(self._stream, tensor, unit) != 0
                or L.hypura_stream_set_home(self._stream, tensor, self.buffer(info.file_idx), data) != 0
                or L.hypura_stream_place(self._stream, tensor, -1) != 0):
            raise HypuraError(f"cannot give tensor '{info.name}' its home in the mapped model file")

    # --- after the load -------------------------------------------------------------------------
    def pieces(self) -> list[tuple[int, int, int]]:
        """(file, offset, length) of page-aligned, disjoint pieces covering the noted ranges, each registered
        once. Every weight lies whole in one piece: CUDA refuses (invalid argument) a copy whose host range
        crosses two registrations, and weights share pages, so a piece ends past PIECE_BYTES only at a page
        no weight shares with the next. Ranges within MERGE_GAP of each other join the same piece."""
        page, out = mmap.PAGESIZE, []
        for f, (_, size) in enumerate(self._maps):
            piece: list[int] = []  # [lo, hi) of the piece being grown
            for start, n in sorted((o, n) for i, o, n in self._ranges if i == f):
                lo, hi = start // page * page, min(size, -(-(start + n) // page) * page)
                if piece and (lo < piece[1] or (lo <= piece[1] + MERGE_GAP and piece[1] - piece[0] < PIECE_BYTES)):
                    piece[1] = max(piece[1], hi)  # a shared page, or near and the piece not full yet
                else:
                    if piece:
                        out.append((f, piece[0], piece[1] - piece[0]))
                    piece = [lo, hi]
            if piece:
                out.append((f, piece[0], piece[1] - piece[0]))
        return out

    def pin(self) -> PinStats:
        """Every noted range read in (where prefetching) and registered with the GPU; see the protocol. A failure
        part-way leaves what was registered recorded, for close() to release."""
        pieces = self.pieces()
        register = _register_fn()
        t0 = time.perf_counter()
        lock = threading.Lock()

        def one(piece: tuple[int, int, int]) -> bool:
            f, at, n = piece
            # whole pages: the file's last one is mapped past its end
            if not register(ffi.cast("void *", self._maps[f][0] + at), -(-n // mmap.PAGESIZE) * mmap.PAGESIZE):
                return False
            with lock:
                self._registered.append(self._maps[f][0] + at)
            return True

        chunks = _chunks(pieces) if self.prefetch else []
        workers = min(self.threads, max(1, len(pieces), len(chunks)))
        with ThreadPoolExecutor(workers, thread_name_prefix="hypura-pin") as pool:
            if chunks:  # every page in the cache first: a registration faults a cold page in alone
                reads = _Prefetch(self.paths)
                try:
                    list(pool.map(lambda chunk: reads.read(*chunk), chunks))
                finally:
                    reads.close()
            done = list(pool.map(one, pieces)) if register is not None else [True] * len(pieces)
        refused = sum(n for (_, _, n), ok in zip(pieces, done) if not ok)
        self.stats = PinStats(sum(n for _, _, n in pieces), time.perf_counter() - t0, refused, register is not None)
        if refused:
            warnings.warn(f"hypura: the GPU did not pin {refused / 2**30:.1f} GiB of the mapped weights: the GPU "
                          f"copies them at pageable speed", stacklevel=2)
        return self.stats

    def check(self) -> None:
        """Raise if a file changed in place since it was mapped (before and after each decode, on the decoding
        thread): the GPU's registered pages keep the old bytes, the mapping sees the new ones, and the results are
        void; a page cut off the file's end would fault (SIGBUS) where a decode read it."""
        for path, (fd, size, mtime) in zip(self.paths, self._files):
            now = os.fstat(fd)
            if (now.st_size, now.st_mtime_ns) != (size, mtime):
                what = f"it shrank to {now.st_size} bytes" if now.st_size < size else "it was written to"
                raise ModelFileError(f"{path} changed while in use ({what}): the results are void; load it again")

    def close(self) -> None:
        """After the model and its contexts are freed; safe to call twice."""
        unregister = _unregister_fn() if self._registered else None
        for addr in self._registered:
            unregister(ffi.cast("void *", addr))
        self._registered = []
        if self._stream is not None:
            lib().hypura_stream_free(self._stream)
            self._stream = None
        for buf in self._buffers:
            if buf is not None:
                lib().ggml_backend_buffer_free(buf)  # a buffer over memory it does not own: frees nothing else
        self._buffers = [None] * len(self._buffers)
        for addr, size in self._maps:
            unmap(addr, size)
        self._maps = []
        for fd, _, _ in self._files:
            os.close(fd)
        self._files = []


class _Prefetch:
    """Reads file ranges through the page cache (the cached readers of tiers/file_readers.py, each worker its own,
    with their retries and errors) and drops the bytes: the pages land in the cache, where the mapping finds them."""

    def __init__(self, paths: list[str]):
        self.paths = paths
        self._local = threading.local()
        self._readers: list[FileReaders] = []
        self._lock = threading.Lock()  # guards _readers (each worker adds its own once)

    def read(self, f: int, at: int, n: int) -> None:
        readers = getattr(self._local, "readers", None)
        if readers is None:
            readers = self._local.readers = FileReaders(self.paths, request=READ_BYTES, cached=True)
            with self._lock:
                self._readers.append(readers)
        readers.get(f).read(at, n, lambda piece, pos: None)

    def close(self) -> None:
        for readers in self._readers:
            readers.close()


def _stamp(fd: int) -> tuple[int, int, int]:
    st = os.fstat(fd)
    return fd, st.st_size, st.st_mtime_ns


def _chunks(pieces: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The pieces cut in reads of at most PIECE_BYTES, so a large piece's pages come in on several workers."""
    return [(f, pos, min(PIECE_BYTES, at + n - pos)) for f, at, n in pieces for pos in range(at, at + n, PIECE_BYTES)]


def _proc(name: bytes, signature: str):
    gpu = first_gpu()
    if gpu is None:
        return None
    L = lib()
    fn = L.ggml_backend_reg_get_proc_address(L.ggml_backend_dev_backend_reg(gpu), name)
    return None if fn == ffi.NULL else ffi.cast(signature, fn)


def _register_fn():
    """ggml-cuda's registration of host memory (cudaHostRegister, read-only), None without a GPU or with
    $HYPURA_PIN_MAPPED=0. It registers only where GGML_CUDA_REGISTER_HOST is set (bindings/library.py sets it);
    llama.cpp's own loads never call it."""
    if not PIN_MAPPED:
        return None
    return _proc(b"ggml_backend_register_host_buffer", "bool (*)(void *, size_t)")


def _unregister_fn():
    return _proc(b"ggml_backend_unregister_host_buffer", "void (*)(void *)")
