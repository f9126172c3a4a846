"""The GGUF header, read and checked in Python before llama.cpp sees the file.

Reading maps the file and touches only the header (gguf-py), so it is instant even for a
40 GB model. Every problem a user can cause (missing file, not a GGUF, truncated, a tensor
past the end, an architecture llama.cpp doesn't know) becomes one ModelFileError line.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

import gguf

from hypura.errors import ModelFileError

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    ggml_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order, innermost first
    offset: int  # absolute offset of the data in the file
    nbytes: int

    @property
    def layer(self) -> int:
        """Block index, -1 for tensors outside the repeating blocks."""
        m = _LAYER_RE.match(self.name)
        return int(m.group(1)) if m else -1


@dataclass(frozen=True)
class KV:
    """One metadata entry, typed as in the file (what a writer needs to copy it)."""

    key: str
    value: object
    vtype: gguf.GGUFValueType
    sub_type: Optional[gguf.GGUFValueType] = None  # element type of an ARRAY


@dataclass(frozen=True)
class ModelHeader:
    path: Path
    file_size: int
    arch: str
    metadata: dict  # scalar and string key/values; arrays (tokenizer) are left out
    tensors: tuple[TensorEntry, ...]
    data_offset: int  # where the aligned data region starts

    def get(self, key: str, default=None):
        """An `{arch}.`-relative or absolute metadata key."""
        if key in self.metadata:
            return self.metadata[key]
        return self.metadata.get(f"{self.arch}.{key}", default)

    @property
    def n_layer(self) -> int:
        return int(self.get("block_count", 0))

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def _known_archs() -> set[str]:
    return set(gguf.MODEL_ARCH_NAMES.values())


# struct codes of GGUF's fixed-size value types
STRUCT_CODES = {
    gguf.GGUFValueType.UINT8: "B", gguf.GGUFValueType.INT8: "b",
    gguf.GGUFValueType.UINT16: "H", gguf.GGUFValueType.INT16: "h",
    gguf.GGUFValueType.UINT32: "I", gguf.GGUFValueType.INT32: "i",
    gguf.GGUFValueType.FLOAT32: "f", gguf.GGUFValueType.BOOL: "?",
    gguf.GGUFValueType.UINT64: "Q", gguf.GGUFValueType.INT64: "q",
    gguf.GGUFValueType.FLOAT64: "d",
}


class _Cursor:
    """Bounds-checked little-endian reads over the mapped header."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError("header ends early")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise ValueError("header ends early")
        self.pos += n

    def string(self) -> str:
        n = self.take("<Q")
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace")

    def value(self, vtype: int, keep_arrays: bool):
        """The value, or for an array its (sub_type, items); items are None unless kept."""
        vtype = gguf.GGUFValueType(vtype)
        if vtype == gguf.GGUFValueType.STRING:
            return self.string()
        if vtype != gguf.GGUFValueType.ARRAY:
            return self.take("<" + STRUCT_CODES[vtype])
        etype, count = gguf.GGUFValueType(self.take("<I")), self.take("<Q")
        if etype == gguf.GGUFValueType.STRING and not keep_arrays:
            for _ in range(count):  # skip without decoding: a vocabulary is 100k+ strings
                self.skip(self.take("<Q"))
            items = None
        elif etype in (gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY):
            items = [self.value(etype, keep_arrays) for _ in range(count)]
        else:
            code = STRUCT_CODES[etype]
            start = self.pos
            self.skip(struct.calcsize(code) * count)
            items = list(struct.unpack_from(f"<{count}{code}", self.buf, start)) if keep_arrays else None
        return etype, items if keep_arrays else None


def _parse(buf, keep_arrays: bool = False) -> tuple[list[KV], list[TensorEntry], int]:
    cur = _Cursor(buf)
    cur.take("<I")  # magic, checked by the caller
    version = cur.take("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported")
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    kvs = []
    for _ in range(n_kv):
        key = cur.string()
        vtype = gguf.GGUFValueType(cur.take("<I"))
        value = cur.value(vtype, keep_arrays)
        if vtype == gguf.GGUFValueType.ARRAY:
            kvs.append(KV(key, value[1], vtype, value[0]))
        else:
            kvs.append(KV(key, value, vtype))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("<I")
        if n_dims > 4:
            raise ValueError(f"tensor '{name}' has {n_dims} dimensions")
        shape = tuple(cur.take("<Q") for _ in range(n_dims))
        infos.append((name, shape, cur.take("<I"), cur.take("<Q")))
    alignment = int(next((kv.value for kv in kvs if kv.key == "general.alignment"), 32))
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"invalid general.alignment {alignment}")
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors = []
    for name, shape, raw_type, rel_offset in infos:
        ggml_type = gguf.GGMLQuantizationType(raw_type)
        block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
        n_elements = 1
        for d in shape:
            n_elements *= d
        if shape and shape[0] % block:
            raise ValueError(f"tensor '{name}' row of {shape[0]} is not a multiple of its block size {block}")
        tensors.append(TensorEntry(name, ggml_type, shape, data_start + rel_offset, n_elements // block * type_size))
    return kvs, tensors, data_start


def read_header(path: str | os.PathLike) -> ModelHeader:
    """Parse and validate a GGUF header; raises ModelFileError with a one-line reason."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"{p}: no such file")
    if not p.is_file():
        raise ModelFileError(f"{p}: not a regular file")
    return _read_header_cached(p.resolve(), *_stat_key(p))


def _stat_key(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_size, st.st_mtime_ns


@lru_cache(maxsize=8)
def _read_header_cached(p: Path, size: int, _mtime: int) -> ModelHeader:
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read ({e.strerror})") from None
    if magic != b"GGUF":
        raise ModelFileError(f"{p}: not a GGUF file (bad magic {magic!r})")
    try:
        kvs, tensors, data_offset = _parse_file(p)
    except (ValueError, KeyError, struct.error, OverflowError) as e:
        raise ModelFileError(f"{p}: corrupt or truncated GGUF file ({e})") from None
    metadata = {kv.key: kv.value for kv in kvs if kv.vtype != gguf.GGUFValueType.ARRAY}
    arch = metadata.get("general.architecture")
    if not arch:
        raise ModelFileError(f"{p}: GGUF file has no general.architecture")
    if arch not in _known_archs():
        raise ModelFileError(f"{p}: unsupported model architecture '{arch}'")

    for entry in tensors:
        if entry.offset + entry.nbytes > size:
            raise ModelFileError(
                f"{p}: tensor '{entry.name}' ends at byte {entry.offset + entry.nbytes} "
                f"past the end of the file ({size} bytes): truncated or corrupt"
            )
    if not tensors:
        raise ModelFileError(f"{p}: GGUF file holds no tensors")
    return ModelHeader(path=p, file_size=size, arch=arch, metadata=metadata, tensors=tuple(tensors),
                       data_offset=data_offset)


def _parse_file(p: Path, keep_arrays: bool = False) -> tuple[list[KV], list[TensorEntry], int]:
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return _parse(m, keep_arrays)


def read_kv(path: str | os.PathLike) -> list[KV]:
    """Every metadata entry, arrays (tokenizer tables) included, typed for copying."""
    p = Path(read_header(path).path)  # validates the file first
    return _parse_file(p, keep_arrays=True)[0]
