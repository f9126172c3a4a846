"""Sequential read bandwidth of a filesystem, with the page cache out of the way.

A test file is written with O_DIRECT (or, where the filesystem refuses it, written, fsync'ed and
dropped from the cache with posix_fadvise(DONTNEED)), then read back with O_DIRECT into 4 KiB-
aligned mmap buffers at the request size and thread counts the runtime uses: sequentially in 4 MiB
requests (streamed layers), then at random offsets in 1 MiB requests (experts, read where routers
send decode). Reading a file just written through the cache is how Hypura's profiler reported 33 GB/s
"NVMe": never do that.
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hypura.errors import HypuraError
from hypura.profile import measure_knobs as knobs
from hypura.profile.machine import DiskInfo
from hypura.tiers.direct_io import O_DIRECT, aligned_buffer, no_cache


def fs_type(path: Path) -> str:
    """The mount's filesystem type from /proc/mounts (longest matching mount point)."""
    try:
        real = str(path.resolve())
        best, kind = "", "unknown"
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mount = parts[1].replace("\\040", " ")
                if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                    best, kind = mount, parts[2]
        return kind
    except OSError:
        return "apfs" if sys.platform == "darwin" else "unknown"


def _write(name: Path, size: int, request: int) -> bool:
    """Write the test file; True if it went through O_DIRECT. Random bytes, so no storage layer
    can compress or dedupe the reads into something faster than the disk."""
    buf = aligned_buffer(request)
    words = np.frombuffer(buf, dtype=np.uint64)
    words[:] = np.random.default_rng(0).integers(0, 2**63, words.size, dtype=np.uint64)
    for direct in ((True, False) if O_DIRECT else (False,)):
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (O_DIRECT if direct else 0), 0o600)
        except OSError as e:
            if direct and e.errno == errno.EINVAL:
                continue
            raise
        try:
            no_cache(fd)
            for i, off in enumerate(range(0, size, request)):
                words[:: knobs.DIRECT_ALIGN // 8] = i  # each 4 KiB block differs from every other
                os.pwritev(fd, [buf], off)
            os.fsync(fd)
            if not direct and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            return direct
        except OSError as e:
            if direct and e.errno == errno.EINVAL:
                continue  # the filesystem accepted the flag at open but not the I/O
            raise
        finally:
            os.close(fd)
    return False


def _read_pass(name: Path, size: int, request: int, threads: int, seconds: float, direct: bool,
               at_random: bool = False, start: int = 0) -> float:
    fd = os.open(name, os.O_RDONLY | (O_DIRECT if direct else 0))
    try:
        no_cache(fd)
        if not direct and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drop what the last pass cached
        offsets = itertools.count(start, request)  # next() on a count is atomic under the GIL
        done = [0] * threads
        t0 = time.perf_counter()
        stop = t0 + seconds

        def reader(k: int) -> None:
            buf = aligned_buffer(request)  # per-thread, aligned; preadv releases the GIL
            rng = random.Random(k)
            places = (size - request) // knobs.DIRECT_ALIGN + 1  # random: any aligned offset a request fits at
            while time.perf_counter() < stop:
                off = rng.randrange(places) * knobs.DIRECT_ALIGN if at_random else next(offsets)
                if off >= size:
                    return
                done[k] += os.preadv(fd, [buf], off)

        pool = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return sum(done) / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def measure_disk(path: str | os.PathLike, size: int = knobs.DISK_TEST_BYTES,
                 request: int = knobs.DISK_REQUEST_BYTES, threads: tuple[int, ...] = knobs.DISK_THREADS,
                 seconds: float = knobs.DISK_PASS_S, progress: Callable[[str], None] = lambda _: None,
                 random_request: int = knobs.DISK_RANDOM_REQUEST_BYTES) -> DiskInfo:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise HypuraError(f"--path {folder}: not a directory")
    free = shutil.disk_usage(folder).free
    size = min(size, free // 4) // request * request  # never fill a nearly full disk
    if size < 4 * request:
        raise HypuraError(f"{folder}: too little free space ({free >> 20} MiB) for a disk test")
    kind = fs_type(folder)
    name = folder / f".hypura-disk-test-{os.getpid()}"
    try:
        progress(f"writing a {size >> 20} MiB test file in {folder} ({kind})")
        try:
            direct = _write(name, size, request)
            by_threads = []
            for n in threads:
                try:
                    bw = _read_pass(name, size, request, n, seconds, direct)
                except OSError as e:
                    if not (direct and e.errno == errno.EINVAL):
                        raise
                    direct = False  # O_DIRECT writes worked but reads do not: fall back, say so
                    bw = _read_pass(name, size, request, n, seconds, direct)
                by_threads.append((n, bw))
                progress(f"read {request >> 20} MiB requests x {n} thread(s): {bw / 1e9:.2f} GB/s")
            random_by_threads = _random_passes(name, size, random_request, threads, seconds, direct, progress)
        except OSError as e:
            raise HypuraError(f"disk test in {folder} failed: {e.strerror or e}") from None
    finally:
        name.unlink(missing_ok=True)
    if direct:
        method = "O_DIRECT write, then O_DIRECT reads into 4 KiB-aligned buffers"
    else:
        method = (f"O_DIRECT unsupported on {kind}: buffered reads after fsync + posix_fadvise(DONTNEED)"
                  + ("; tmpfs keeps the file in RAM, so this is memory speed, not storage" if kind == "tmpfs" else ""))
    return _disk_info(str(folder.resolve()), kind, direct, method, request, by_threads, random_request,
                      random_by_threads)


def measure_file(file: str | os.PathLike, request: int = knobs.DISK_REQUEST_BYTES,
                 threads: tuple[int, ...] = knobs.DISK_THREADS, seconds: float = knobs.DISK_PASS_S,
                 progress: Callable[[str], None] = lambda _: None,
                 random_request: int = knobs.DISK_RANDOM_REQUEST_BYTES) -> DiskInfo:
    """The same passes over an existing file, read only: a model file, so the disk measured is the model's,
    nothing is written, and the file is far larger than any cache a virtual disk's host may keep (on the
    CPU VM, 2026-12-04: the 40 GB 70B read 1.34 / 1.70 GB/s on 1 / 2 threads, a 512 MiB test file
    0.92 / 1.64). Each sequential pass starts at its own place, so no pass reads what an earlier one read."""
    path = Path(file).resolve()
    size = path.stat().st_size // knobs.DIRECT_ALIGN * knobs.DIRECT_ALIGN
    kind = fs_type(path.parent)
    passes = 2 * len(threads)
    region = size // passes // request * request
    if region < 4 * request:
        raise HypuraError(f"{path}: too small to measure its disk ({size >> 20} MiB)")
    progress(f"reading {path.name} ({size >> 30} GiB, {kind}) with O_DIRECT, read only")
    by_threads = []
    try:
        for i, n in enumerate(threads):
            end = (i + 1) * region  # a pass stops at the end of its region: the next one starts there
            bw = _read_pass(path, end, request, n, seconds, True, start=i * region)
            by_threads.append((n, bw))
            progress(f"read {request >> 20} MiB requests x {n} thread(s): {bw / 1e9:.2f} GB/s")
        random_by_threads = _random_passes(path, size, random_request, threads, seconds, True, progress)
    except OSError as e:
        raise HypuraError(f"disk test on {path} failed: {e.strerror or e}") from None
    return _disk_info(str(path.parent), kind, True,
                      f"O_DIRECT reads of {path.name} into 4 KiB-aligned buffers (the model's own file, read only)",
                      request, by_threads, random_request, random_by_threads)


def _random_passes(path, size: int, request: int, threads, seconds: float, direct: bool, progress) -> list:
    """(threads, bytes/s) of reads of `request` bytes at random places, one pass a thread count."""
    out = []
    for n in threads:
        bw = _read_pass(path, size, request, n, seconds, direct, at_random=True)
        out.append((n, bw))
        progress(f"read {request >> 20} MiB requests at random x {n} thread(s): {bw / 1e9:.2f} GB/s")
    return out


def _disk_info(path: str, kind: str, direct: bool, method: str, request: int, by_threads: list,
               random_request: int, random_by_threads: list) -> DiskInfo:
    return DiskInfo(path=path, fs_type=kind, direct_io=direct, method=method, request_bytes=request,
                    read_bw=max(bw for _, bw in by_threads), by_threads=tuple(by_threads),
                    random_request_bytes=random_request, random_read_bw=max(bw for _, bw in random_by_threads),
                    random_by_threads=tuple(random_by_threads))
