"""One DirectReader per file of a model (a split model has several), opened at first use."""

from __future__ import annotations

from typing import Optional

from hypura.tiers.direct_io import DISK_REQUEST_BYTES, DirectReader, DiskReadError, Pread


class FileReaders:
    def __init__(self, paths: list[str], request: int = DISK_REQUEST_BYTES, staging=None, cached: bool = False):
        """staging: the buffer every reader reads into (see DirectReader); by default each maps its own.
        cached: read through the page cache (DirectReader's `cached`)."""
        self.paths, self.request, self.staging, self.cached = paths, request, staging, cached
        self._readers: dict[int, DirectReader] = {}

    def get(self, file_idx: int, pread: Optional[Pread] = None) -> DirectReader:
        """The reader of file `file_idx`; pread (os.preadv's shape) is what a newly opened one reads with."""
        reader = self._readers.get(file_idx)
        if reader is None:
            if not 0 <= file_idx < len(self.paths):
                raise DiskReadError(f"split {file_idx} of the model is not known to Hypura (it was given "
                                    f"{len(self.paths)} file{'s' if len(self.paths) != 1 else ''})")
            given = {"pread": pread} if pread is not None else {}
            reader = self._readers[file_idx] = DirectReader(self.paths[file_idx], self.request,
                                                            staging=self.staging, cached=self.cached, **given)
        return reader

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
