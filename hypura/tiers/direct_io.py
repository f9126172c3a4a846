"""Disk-tier reads that bypass the page cache (O_DIRECT), with every failure reported.

The page cache is a hidden tier: a disk-tier tensor read through it stays in RAM the budget
does not count. O_DIRECT needs offset, length and buffer aligned to the device block (4 KiB is
safe everywhere); GGUF aligns tensors to 32 bytes only, so each request is widened to aligned
bounds in an aligned staging buffer and the wanted slice handed on. Short reads continue where
they stopped (realigned); EINTR, EAGAIN and EIO are retried a bounded number of times, then
raised as DiskReadError with file, offset and size: never a silently missing byte. Where the
filesystem refuses O_DIRECT (tmpfs), reads are buffered and dropped from the cache after use.
A reader made `cached` reads a file the page cache holds already (runtime/load_reads.py) through the
cache and leaves its pages there; `read_into` then reads straight into the destination, one copy.
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
from typing import Callable

from hypura.errors import HypuraError

# O_DIRECT needs buffers, offsets and sizes aligned to the logical block size; 4 KiB covers NVMe
DIRECT_ALIGN = 4096
# the request size of disk reads: a layer slice or an expert is MBs; 4 MiB keeps NVMe queues busy
# without huge staging buffers
DISK_REQUEST_BYTES = 4 << 20

O_DIRECT = getattr(os, "O_DIRECT", 0)
_F_NOCACHE = 48  # macOS fcntl: the page cache is bypassed for this descriptor
READ_RETRIES = 3  # transient errors per request before giving up
_TRANSIENT = (errno.EINTR, errno.EAGAIN, errno.EIO)

Pread = Callable[[int, list, int], int]  # os.preadv's shape: (fd, buffers, offset) -> bytes read


class DiskReadError(HypuraError, OSError):
    """A read of model weights failed or came up short."""


def aligned_buffer(nbytes: int) -> mmap.mmap:
    """Anonymous mappings are page-aligned: what O_DIRECT needs."""
    return mmap.mmap(-1, nbytes)


def no_cache(fd: int) -> None:
    """macOS has no O_DIRECT: F_NOCACHE on the descriptor does the same job."""
    if sys.platform == "darwin":
        import fcntl

        fcntl.fcntl(fd, _F_NOCACHE, 1)


class DirectReader:
    """Reads byte ranges of one file around the page cache, `request` bytes at a time."""

    def __init__(self, path: str | os.PathLike, request: int = DISK_REQUEST_BYTES,
                 retries: int = READ_RETRIES, pread: Pread = os.preadv, staging=None, cached: bool = False):
        """staging: a page-aligned writable buffer of `request + DIRECT_ALIGN` bytes to read into
        (e.g. pinned memory a copy engine reads from); by default one is mapped here. cached: read through
        the page cache and keep the pages (a file it holds already)."""
        self.path, self.retries, self._pread, self.cached = str(path), retries, pread, cached
        self.request = max(DIRECT_ALIGN, request - request % DIRECT_ALIGN)
        self._own_buf = staging is None
        # one extra block: unaligned starts
        self.buf = aligned_buffer(self.request + DIRECT_ALIGN) if staging is None else staging
        self.fd, self.direct = -1, False
        self._open(direct=bool(O_DIRECT) and not cached)
        self.size = os.fstat(self.fd).st_size

    def _open(self, direct: bool) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | (O_DIRECT if direct else 0))
        except OSError as e:
            if direct and e.errno == errno.EINVAL:  # e.g. tmpfs
                return self._open(direct=False)
            raise DiskReadError(f"cannot open {self.path}: {e.strerror}") from None
        self.direct = direct
        if not self.cached:
            no_cache(self.fd)

    def read(self, offset: int, nbytes: int, sink: Callable[[memoryview, int], None]) -> None:
        """Hand [offset, offset + nbytes) to sink(piece, position within the range), in order."""
        self.check_range(offset, nbytes)
        done = 0
        while done < nbytes:
            skip, n = self.stage(offset + done, min(self.request, nbytes - done))
            with memoryview(self.buf) as view:
                sink(view[skip:skip + n], done)
            done += n

    def check_range(self, offset: int, nbytes: int) -> None:
        if offset < 0 or offset + nbytes > self.size:
            raise DiskReadError(f"{self.path}: bytes {offset}..{offset + nbytes} lie past its end ({self.size})")

    def stage(self, start: int, want: int) -> tuple[int, int]:
        """Read [start, start + want) into the staging buffer (want <= request), as one aligned request;
        returns (where the bytes start in the buffer, how many): fewer than `want` only at the end of file."""
        lo = start - start % DIRECT_ALIGN
        got = self._fill(lo, -(-(start + want - lo) // DIRECT_ALIGN) * DIRECT_ALIGN)
        skip = start - lo
        n = min(want, got - skip)
        if n <= 0:
            raise DiskReadError(f"{self.path}: read at byte {start} returned nothing before the end")
        self._drop(start, n)
        return skip, n

    def read_into(self, offset: int, nbytes: int, dest: memoryview) -> None:
        """[offset, offset + nbytes) into dest (nbytes long): straight into it where reads are buffered,
        else through the aligned staging buffer."""
        if self.direct:
            return self.read(offset, nbytes, lambda piece, at: dest.__setitem__(slice(at, at + len(piece)), piece))
        self.check_range(offset, nbytes)
        done = 0
        while done < nbytes:
            want = min(self.request, nbytes - done)
            got = self._read_plain(dest[done:done + want], offset + done)
            self._drop(offset + done, got)
            done += got

    def _read_plain(self, view: memoryview, pos: int) -> int:
        """A buffered read of all of view at pos, continuing short reads; transient errors retried."""
        got, failures = 0, 0
        while got < len(view):
            try:
                n = self._pread(self.fd, [view[got:]], pos + got)
            except OSError as e:
                if e.errno in _TRANSIENT and failures < self.retries:
                    failures += 1
                    continue
                raise DiskReadError(f"{self.path}: reading {len(view)} bytes at {pos + got} failed after "
                                    f"{failures} retries: {e.strerror or e}") from None
            if n <= 0:
                failures += 1
                if failures > self.retries:
                    raise DiskReadError(f"{self.path}: reads at byte {pos + got} keep returning nothing")
            got += max(n, 0)
        return got

    def _drop(self, start: int, n: int) -> None:
        """A buffered read of a file not cached before leaves nothing in the cache."""
        if not self.direct and not self.cached and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, start, n, os.POSIX_FADV_DONTNEED)

    def _fill(self, pos: int, length: int) -> int:
        """Read [pos, pos + length) into the staging buffer; fewer bytes only at end of file."""
        target = min(length, self.size - pos)
        got, failures = 0, 0
        with memoryview(self.buf) as view:
            while got < target:
                try:
                    n = self._pread(self.fd, [view[got:length]], pos + got)
                except OSError as e:
                    if e.errno == errno.EINVAL and self.direct:  # O_DIRECT accepted at open, not for I/O
                        self._open(direct=False)
                        continue
                    if e.errno in _TRANSIENT and failures < self.retries:
                        failures += 1
                        continue
                    raise DiskReadError(
                        f"{self.path}: reading {length} bytes at {pos + got} failed after {failures} "
                        f"retries: {e.strerror or e}") from None
                before = got
                got += n
                if self.direct and got < target:
                    got -= got % DIRECT_ALIGN  # O_DIRECT resumes on a block boundary
                # nothing before the end of file; a short read that progressed is fine. A file cut within a
                # block reads the same partial block again and again under O_DIRECT: no progress either
                if got <= before and got < target:
                    failures += 1
                    if failures > self.retries:
                        now = os.fstat(self.fd).st_size  # a file cut while in use reads as nothing past its new end
                        cut = f": the file shrank to {now} bytes while in use" if now < self.size else ""
                        raise DiskReadError(f"{self.path}: reads at byte {pos + got} keep returning nothing{cut}")
        return min(got, target)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._own_buf:
            try:
                self.buf.close()
            except BufferError:  # a view survives in a pending exception's traceback: freed with it
                pass

    def __enter__(self) -> "DirectReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
