"""How much of a file the page cache holds now: mincore(2) over a read-only mapping of it, which maps
no page in and reads nothing, sampled where the file is large.

`cached_share(path)` is a fraction in [0, 1]; `evict(path)` asks the kernel to drop the file's clean
pages (posix_fadvise DONTNEED), as a dropped cache would. Where mincore or the mapping is missing
(not Linux or macOS), the share is 0.0: a file is then read as a cold one, around the cache.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import sys

# windows of pages looked at: 256 windows of 1 MiB read 256 MiB of page flags (64 Ki bytes of vector) at
# most, enough that a share is within a few per cent for a file cached in runs, in ~1 ms for a 40 GB file
SAMPLE_WINDOWS = 256
WINDOW_BYTES = 1 << 20
_PROT_READ, _MAP_SHARED = mmap.PROT_READ, mmap.MAP_SHARED
_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.lru_cache(maxsize=1)  # find_library runs ldconfig
def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    return libc


def map_read_only(path: str | os.PathLike) -> tuple[int, int]:
    """(address, size) of a read-only shared mapping of the whole file (nothing is read until touched); (0, size)
    where it cannot be mapped (an empty file, or no mmap here)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = _libc().mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0) if size else None
    finally:
        os.close(fd)  # the mapping keeps the file
    return (0, size) if addr in (None, _MAP_FAILED) else (addr, size)


def unmap(addr: int, size: int) -> None:
    if addr:
        _libc().munmap(ctypes.c_void_p(addr), size)


def windows(size: int, page: int = mmap.PAGESIZE) -> list[tuple[int, int]]:
    """(offset, length) of the page-aligned windows looked at: the whole file when it is at most
    SAMPLE_WINDOWS windows long, else SAMPLE_WINDOWS windows spread evenly over it."""
    if size <= SAMPLE_WINDOWS * WINDOW_BYTES:
        return [(0, size)] if size > 0 else []
    stride = size // SAMPLE_WINDOWS
    return [((k * stride) // page * page, WINDOW_BYTES) for k in range(SAMPLE_WINDOWS)]


def cached_share(path: str | os.PathLike, start: int = 0, end: int | None = None) -> float:
    """The share of `path`'s pages (of bytes [start, end): default the whole file) in the page cache (sampled:
    windows()); 0.0 where it cannot be told."""
    if sys.platform not in ("linux", "darwin"):
        return 0.0
    libc, page = _libc(), mmap.PAGESIZE
    addr, size = map_read_only(path)
    if not addr:
        return 0.0
    try:
        cached = total = 0
        lo = start // page * page
        hi = size if end is None else min(end, size)
        for off, length in windows(max(0, hi - lo), page):
            off += lo
            length = min(length, hi - off)
            n = -(-length // page)
            vec = (ctypes.c_ubyte * n)()
            if libc.mincore(ctypes.c_void_p(addr + off), length, vec) != 0:
                return 0.0
            cached += sum(b & 1 for b in bytes(vec))
            total += n
        return cached / total if total else 0.0
    finally:
        unmap(addr, size)


def uncached_runs(path: str | os.PathLike) -> list[tuple[int, int]]:
    """(offset, length) of every run of pages of `path` not in the page cache now (the whole file looked at);
    [] where it cannot be told."""
    import numpy as np

    if sys.platform not in ("linux", "darwin"):
        return []
    page = mmap.PAGESIZE
    addr, size = map_read_only(path)
    if not addr:
        return []
    try:
        vec = np.zeros(-(-size // page), dtype=np.uint8)
        if _libc().mincore(ctypes.c_void_p(addr), size, vec.ctypes.data_as(ctypes.c_void_p)) != 0:
            return []
    finally:
        unmap(addr, size)
    cold = np.concatenate(([0], (vec & 1) == 0, [0])).astype(np.int8)
    edges = np.flatnonzero(np.diff(cold))  # starts and ends of the runs, alternately
    return [(int(a) * page, int(b - a) * page) for a, b in zip(edges[::2], edges[1::2])]


def drop(path: str | os.PathLike, runs: list[tuple[int, int]]) -> None:
    """Drop these byte ranges of the file from the page cache (clean pages: nothing is lost)."""
    if not runs or not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        for off, length in runs:
            os.posix_fadvise(fd, off, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict(path: str | os.PathLike) -> None:
    """Drop the file's clean pages from the page cache (what `echo 1 > drop_caches` does for every file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.fsync(fd)  # dirty pages (a file just written) are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
