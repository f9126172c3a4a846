"""Loader hooks across the cffi boundary: Python decides where each tensor goes.

Protocol
  `LoaderHooks(policy, filler)` is a context manager around one model load. Entering
  installs C hooks for the calling thread (`hypura_loader_hooks_set`). During
  `llama_model_load_from_file` on that thread, llama.cpp calls `place` once per tensor
  (after choosing its own buffer type) and `fill` once per deferred tensor, synchronously,
  holding no lock of ours; the cffi callbacks take the GIL. Exiting clears the hooks.

  A Python exception must never unwind into C: each callback catches it, stores it and
  returns -1, which makes llama.cpp abort the load (the model pointer comes back NULL).
  `raise_pending()` then re-raises the stored exception in the caller.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional

from hypura.bindings.ffi import ffi, lib
from hypura.tiers.file_readers import FileReaders


class Tier(enum.IntEnum):
    """Mirrors `enum hypura_tier`."""

    DEFAULT = 0  # keep llama.cpp's choice
    GPU = 1
    HOST = 2  # as llama.cpp places a tensor overridden to CPU
    PINNED = 3


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ggml order, innermost first
    file_offset: int
    nbytes: int
    file_idx: int
    layer: int  # -1 outside the repeating blocks
    default_tier: Tier
    default_buft: str

    @classmethod
    def from_c(cls, info) -> "TensorInfo":
        return cls(
            name=ffi.string(info.name).decode(),
            ggml_type=info.type,
            shape=tuple(info.ne[i] for i in range(info.n_dims)),
            file_offset=info.file_offset,
            nbytes=info.nbytes,
            file_idx=info.file_idx,
            layer=info.layer,
            default_tier=Tier(info.default_tier),
            default_buft=ffi.string(info.default_buft).decode(),
        )


@dataclass(frozen=True)
class Placement:
    tier: Tier = Tier.DEFAULT
    defer: bool = False  # the loader skips the bytes; the filler provides them
    pool_slot: int = -1  # >= 0: streamed through this slot of the tier's pool (deferred too)


PlacementPolicy = Callable[[TensorInfo], Placement]
Filler = Callable[[TensorInfo, object], None]  # (info, ggml_tensor pointer)


def keep_default(info: TensorInfo) -> Placement:
    """The default policy: exactly llama.cpp's own placement."""
    return Placement()


class FileFiller:
    """Fills deferred tensors from the model file around the page cache (DirectReader), or through it
    where it holds the file (`cached`: runtime/load_reads.py), in bounded requests; one reader per file,
    kept open for the whole load."""

    def __init__(self, paths: list[str], cached: bool = False):
        self.paths, self.cached = paths, cached
        self._readers = FileReaders(paths, cached=cached)

    def __call__(self, info: TensorInfo, tensor) -> None:
        def upload(piece: memoryview, at: int) -> None:
            lib().ggml_backend_tensor_set(tensor, ffi.from_buffer(piece), at, len(piece))

        self.read(info, upload)

    def read(self, info: TensorInfo, sink: Callable[[memoryview, int], None]) -> None:
        """Hand the tensor's bytes to sink(piece, position in the tensor), in order."""
        self._readers.get(info.file_idx).read(info.file_offset, info.nbytes, sink)

    def read_into(self, info: TensorInfo, dest) -> None:
        """The tensor's bytes into host memory at `dest` (a cffi pointer): one copy where reads are buffered."""
        self._readers.get(info.file_idx).read_into(info.file_offset, info.nbytes,
                                                   memoryview(ffi.buffer(dest, info.nbytes)))

    def close(self) -> None:
        self._readers.close()


class LoaderHooks:
    """Installs `policy`/`filler` as the loader hooks of this thread for one load."""

    def __init__(self, policy: PlacementPolicy = keep_default, filler: Optional[Filler] = None):
        self.policy = policy
        self.filler = filler
        self.placed: dict[str, tuple[TensorInfo, Placement]] = {}
        self._error: Optional[BaseException] = None
        # the callbacks must stay alive while C holds their pointers
        self._place_cb = ffi.callback("hypura_place_fn", self._place, error=-1, onerror=self._on_error)
        self._fill_cb = ffi.callback("hypura_fill_fn", self._fill, error=-1, onerror=self._on_error)

    def _on_error(self, exc_type, exc, tb) -> None:
        if self._error is None:
            self._error = exc

    def _place(self, c_info, c_out, _user_data) -> int:
        info = TensorInfo.from_c(c_info)
        placement = self.policy(info)
        if (placement.defer or placement.pool_slot >= 0) and self.filler is None:
            raise ValueError(f"policy deferred tensor '{info.name}' but there is no filler")
        self.placed[info.name] = (info, placement)
        c_out.tier = int(placement.tier)
        c_out.flags = ((lib().HYPURA_PLACE_DEFER if placement.defer else 0)
                       | (lib().HYPURA_PLACE_POOL if placement.pool_slot >= 0 else 0))
        c_out.pool_slot = placement.pool_slot
        return 0

    def _fill(self, c_info, tensor, _user_data) -> int:
        self.filler(TensorInfo.from_c(c_info), tensor)
        return 0

    def raise_pending(self) -> None:
        """Re-raise an exception a callback caught (the load has failed because of it)."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> "LoaderHooks":
        hooks = ffi.new("struct hypura_loader_hooks *")
        hooks.place = self._place_cb
        hooks.fill = self._fill_cb
        lib().hypura_loader_hooks_set(hooks)
        return self

    def __exit__(self, *exc) -> None:
        lib().hypura_loader_hooks_set(ffi.NULL)
        if hasattr(self.filler, "close"):
            self.filler.close()
