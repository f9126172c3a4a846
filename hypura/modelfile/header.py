"""The GGUF header, read and checked in Python before llama.cpp sees the file.

Reading maps the file and touches only the header, so it is instant even for a 40 GB model, and
the result is cached per (path, size, mtime). The header is parsed as ggml parses it (reader.py),
then checked against what llama.cpp's loader asserts on (checks.py, vocab_tables.py, tensors.py): every
problem becomes one ModelFileError line naming the field, its value and what was expected.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

import gguf

from hypura.errors import ModelFileError
from hypura.modelfile.checks import check_file
from hypura.modelfile.ggml_types import GGMLType
from hypura.modelfile.problems import Problem
from hypura.modelfile.reader import RawFile, parse
from hypura.modelfile.metadata import Meta
from hypura.modelfile.vocab_tables import DECODED_ARRAYS, FileVocab, file_vocab

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    ggml_type: GGMLType
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


def read_header(path: str | os.PathLike, vocab_only: bool = False) -> ModelHeader:
    """Parse and validate a GGUF header; raises ModelFileError with a one-line reason. vocab_only: checked as a file
    loaded for its vocabulary alone (checks.check_file), which may hold no tensor."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"{p}: no such file")
    if not p.is_file():
        raise ModelFileError(f"{p}: not a regular file")
    return _read_header_cached(p.resolve(), *_stat_key(p), vocab_only)


def read_kv(path: str | os.PathLike) -> list[KV]:
    """Every metadata entry, arrays (tokenizer tables) included, typed for copying."""
    p = Path(read_header(path).path)  # validates the file first
    raw = _parse_file(p, decode_strings=True)
    return [KV(kv.key, _copyable(kv), kv.vtype, kv.sub_type) for kv in raw.kvs]


def read_vocab(path: str | os.PathLike) -> FileVocab:
    """The file's tokenizer (modelfile/vocab_tables.py's FileVocab), from the header alone."""
    header = read_header(path)  # validates the file first
    return file_vocab(Meta(_parse_file(Path(header.path), decode_strings=DECODED_ARRAYS), header.arch))


def _copyable(kv) -> object:
    if kv.items is None:
        return kv.value
    if kv.sub_type == gguf.GGUFValueType.STRING:
        return [s.decode("utf-8", errors="replace") for s in kv.items]
    return kv.items


def _stat_key(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_size, st.st_mtime_ns


@lru_cache(maxsize=8)
def _read_header_cached(p: Path, size: int, _mtime: int, vocab_only: bool = False) -> ModelHeader:
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read ({e.strerror})") from None
    if magic != b"GGUF":
        raise ModelFileError(f"{p}: not a GGUF file (bad magic {magic!r})")
    try:
        raw = _parse_file(p, decode_strings=DECODED_ARRAYS)
        check_file(raw, size, vocab_only)
    except Problem as e:
        raise ModelFileError(f"{p}: {e}") from None
    return _header(p, size, raw)


def _parse_file(p: Path, decode_strings) -> RawFile:
    try:
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return parse(m, decode_strings)
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read ({e.strerror})") from None


def _header(p: Path, size: int, raw: RawFile) -> ModelHeader:
    metadata = {kv.key: kv.value for kv in raw.kvs if kv.vtype != gguf.GGUFValueType.ARRAY}
    tensors = tuple(TensorEntry(t.name, GGMLType(t.ggml_type), t.ne, raw.data_offset + t.offset, t.nbytes)
                    for t in raw.tensors)
    return ModelHeader(path=p, file_size=size, arch=metadata["general.architecture"], metadata=metadata,
                       tensors=tensors, data_offset=raw.data_offset)
