"""The GGUF header parsed exactly as the vendored ggml reads it (ggml/src/gguf.cpp).

Every condition gguf_init_from_file_impl checks before it returns a context is checked here in
the same order, so a file this accepts is one ggml accepts, and a file it rejects fails with one
line naming the field instead of ggml's log lines. Reads are bounds-checked against the mapped
file; nothing is sized from a count the file states before the bytes behind it are known to exist.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Optional

import gguf

from hypura.modelfile.ggml_types import GGML_TYPE_COUNT, TRAITS, ggml_type
from hypura.modelfile.problems import Invalid, Name, Truncated, shown

GGUF_MAX_STRING_LENGTH = 1024 * 1024 * 1024  # gguf.cpp
GGUF_MAX_ARRAY_ELEMENTS = 1024 * 1024 * 1024  # gguf.cpp
GGUF_VERSION = 3  # gguf.h: the newest version ggml reads
GGUF_DEFAULT_ALIGNMENT = 32  # gguf.h
GGML_MAX_NAME = 64  # ggml.h: a tensor name is shorter than this
GGML_MAX_DIMS = 4  # ggml.h
INT64_MAX = 2**63 - 1
SIZE_MAX = 2**64 - 1
# sizeof(gguf_tensor_info) and sizeof(gguf_kv) on 64-bit hosts: gguf.cpp bounds the counts by SIZE_MAX over them
_TENSOR_INFO_SIZE, _KV_SIZE = 344, 88
# the fewest bytes one KV pair and one tensor info take (key length, type, a u8 value; name length,
# n_dims, type, offset): counts the remaining bytes cannot hold are rejected before any loop
_MIN_KV_BYTES, _MIN_TENSOR_INFO_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8
NAME_SHOWN = 60  # characters of a key or tensor name quoted as a message's field

V = gguf.GGUFValueType
# struct codes of GGUF's fixed-size value types
STRUCT_CODES = {
    V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i",
    V.FLOAT32: "f", V.BOOL: "?", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d",
}
# gguf.cpp GGUF_TYPE_NAME, for messages in llama.cpp's words
TYPE_NAMES = {
    V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32", V.INT32: "i32",
    V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "str", V.ARRAY: "arr", V.UINT64: "u64", V.INT64: "i64",
    V.FLOAT64: "f64",
}


@dataclass(frozen=True)
class RawKV:
    """A metadata pair as read; `items` is None for an array whose elements were not decoded."""

    key: str
    vtype: gguf.GGUFValueType
    value: object = None  # a scalar or a string
    sub_type: Optional[gguf.GGUFValueType] = None  # element type of an ARRAY
    count: int = 0  # elements of an ARRAY
    items: Optional[list] = None  # decoded elements (strings as bytes, as llama.cpp compares them)


@dataclass(frozen=True)
class RawTensor:
    name: str
    ne: tuple[int, ...]  # ggml order, innermost first, as stored (n_dims entries)
    ggml_type: int
    offset: int  # relative to the data region
    nbytes: int  # ggml_nbytes


@dataclass(frozen=True)
class RawFile:
    version: int
    kvs: tuple[RawKV, ...]
    tensors: tuple[RawTensor, ...]
    alignment: int
    data_offset: int  # absolute offset of the data region
    data_size: int  # bytes of the data region, tensors padded to the alignment


class _Cursor:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    @property
    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def take(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        if size > self.remaining:
            raise Truncated(what, f"is cut off at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def raw_string(self, what: str) -> bytes:
        n = self.take("<Q", f"{what} length")
        if n > GGUF_MAX_STRING_LENGTH:
            raise Invalid(f"{what} length", n, f"at most {GGUF_MAX_STRING_LENGTH} (gguf.cpp GGUF_MAX_STRING_LENGTH)")
        if n > self.remaining:
            raise Truncated(f"{what} length", f"{n} runs past the end of the file ({self.remaining} bytes left)")
        start = self.pos
        self.pos += n
        return bytes(self.buf[start:self.pos])

    def name(self, what: str) -> str:
        """A key or tensor name: UTF-8 without NUL bytes (ggml compares names as C strings)."""
        raw = self.raw_string(what)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:  # shown from its start only: it may be megabytes of garbage
            raise Invalid(what, raw[:4 * NAME_SHOWN].decode("utf-8", errors="replace"), "UTF-8 text") from None
        if "\0" in text:
            raise Invalid(what, text, "a name without NUL bytes")
        return text


def _value_type(raw: int, what: str) -> gguf.GGUFValueType:
    try:
        return V(raw)
    except ValueError:
        raise Invalid(what, raw, f"a GGUF type 0..{len(V) - 1}") from None


def _read_kv(cur: _Cursor, index: int, decode, seen: set) -> RawKV:
    key = cur.name(f"key {index}")
    if not key:
        raise Invalid(f"key {index}", key, "a non-empty key")
    if key in seen:
        raise Invalid(f"key {index}", key, "each key once (gguf.cpp: duplicate key)")
    seen.add(key)
    k = key if len(key) <= NAME_SHOWN else key[:NAME_SHOWN - 3] + "..."  # names the field of the messages below
    vtype = _value_type(cur.take("<i", f"{k} type"), f"{k} type")
    if vtype == V.STRING:
        return RawKV(key, vtype, cur.raw_string(k).decode("utf-8", errors="replace"))
    if vtype != V.ARRAY:
        return RawKV(key, vtype, cur.take("<" + STRUCT_CODES[vtype], k))
    etype = _value_type(cur.take("<i", f"{k} element type"), f"{k} element type")
    if etype == V.ARRAY:
        raise Invalid(f"{k} element type", Name("arr"), "a scalar or string type (gguf.cpp reads no nested arrays)")
    count = cur.take("<Q", f"{k} count")
    if count > GGUF_MAX_ARRAY_ELEMENTS:
        raise Invalid(f"{k} count", count, f"at most {GGUF_MAX_ARRAY_ELEMENTS} (gguf.cpp GGUF_MAX_ARRAY_ELEMENTS)")
    width = 8 if etype == V.STRING else struct.calcsize(STRUCT_CODES[etype])  # strings: their length fields
    if count * width > cur.remaining:
        raise Truncated(f"{k} count", f"{count} runs past the end of the file ({cur.remaining} bytes left)")
    if etype == V.STRING:
        items = _strings(cur, k, count, decode(key))
    else:
        code = STRUCT_CODES[etype]
        items = list(struct.unpack_from(f"<{count}{code}", cur.buf, cur.pos))
        cur.pos += count * width
    return RawKV(key, vtype, None, etype, count, items)


_U64 = struct.Struct("<Q").unpack_from


def _strings(cur: _Cursor, key: str, count: int, keep: bool) -> Optional[list]:
    """The elements of a string array (bytes, kept when `keep`); a tight loop: a vocabulary and its
    merges are 100k+ strings each."""
    buf, pos, end = cur.buf, cur.pos, len(cur.buf)
    items = [] if keep else None
    for i in range(count):
        if end - pos < 8:
            raise Truncated(f"{key}[{i}] length", f"is cut off at byte {pos}")
        (n,) = _U64(buf, pos)
        pos += 8
        if n > end - pos or n > GGUF_MAX_STRING_LENGTH:
            cur.pos = pos
            if n > GGUF_MAX_STRING_LENGTH:
                raise Invalid(f"{key}[{i}] length", n, f"at most {GGUF_MAX_STRING_LENGTH} (GGUF_MAX_STRING_LENGTH)")
            raise Truncated(f"{key}[{i}] length", f"{n} runs past the end of the file ({end - pos} bytes left)")
        if keep:
            items.append(buf[pos:pos + n])
        pos += n
    cur.pos = pos
    return items


def _read_tensor_info(cur: _Cursor, index: int, seen: set) -> tuple[str, tuple[int, ...], int, int]:
    n = cur.take("<Q", f"tensor {index} name length")
    cur.pos -= 8
    if n >= GGML_MAX_NAME:  # names below are then short enough to quote whole
        start = cur.buf[cur.pos + 8:cur.pos + 8 + NAME_SHOWN]  # no more of a name that may be 62 MB long
        raise Invalid(f"tensor {index} name length", n, f"fewer than {GGML_MAX_NAME} bytes (ggml.h GGML_MAX_NAME; "
                                                        f"the name starts {shown(bytes(start))})")
    name = cur.name(f"tensor {index} name")
    if name in seen:
        raise Invalid(f"tensor {index} name", name, "each tensor name once (gguf.cpp: duplicate tensor name)")
    seen.add(name)
    n_dims = cur.take("<I", f"tensor '{name}' n_dims")
    if n_dims > GGML_MAX_DIMS:
        raise Invalid(f"tensor '{name}' n_dims", n_dims, f"at most {GGML_MAX_DIMS} (ggml.h GGML_MAX_DIMS)")
    ne = tuple(cur.take("<q", f"tensor '{name}' ne[{j}]") for j in range(n_dims))
    for j, n in enumerate(ne):
        if n < 0:
            raise Invalid(f"tensor '{name}' ne[{j}]", n, "a dimension >= 0")
    elements = 1
    for n in ne:
        elements *= n
    if elements > INT64_MAX:
        raise Invalid(f"tensor '{name}' shape", list(ne), f"fewer than {INT64_MAX} elements")
    raw_type = cur.take("<i", f"tensor '{name}' type")
    return name, ne, raw_type, cur.take("<Q", f"tensor '{name}' offset")


def _nbytes(name: str, ne: tuple[int, ...], raw_type: int) -> int:
    """ggml_nbytes of a contiguous tensor, after gguf.cpp's type checks."""
    t = ggml_type(raw_type)
    if t is None:
        expected = f"a type of the vendored ggml (0..{GGML_TYPE_COUNT - 1}, not a removed one)"
        raise Invalid(f"tensor '{name}' type", raw_type, expected)
    traits = TRAITS[t]
    row = ne[0] if ne else 1
    if row % traits.block:
        raise Invalid(f"tensor '{name}' row", row, f"a multiple of {t.name}'s block of {traits.block}")
    elements = 1
    for n in ne:
        elements *= n
    if elements // traits.block > SIZE_MAX // traits.size:
        raise Invalid(f"tensor '{name}' shape", list(ne), f"fewer than {SIZE_MAX} bytes")
    return elements // traits.block * traits.size


def parse(buf, decode_strings=frozenset()) -> RawFile:
    """The header of the GGUF file mapped as `buf`, checked as gguf.cpp checks it. String arrays are
    decoded for the keys in `decode_strings` (True: all of them), numeric arrays always."""
    cur = _Cursor(buf)
    magic = cur.take("<4s", "magic")
    if magic != b"GGUF":
        raise Invalid("magic", magic.decode("latin-1"), "'GGUF' (not a GGUF file)")
    version = cur.take("<I", "version")
    if version == 0 or version & 0xFFFF == 0 or version == 1 or version > GGUF_VERSION:
        raise Invalid("GGUF version", version, f"2 or {GGUF_VERSION}, little-endian")
    n_tensors = cur.take("<q", "tensor count")
    n_kv = cur.take("<q", "metadata key count")
    for what, n, per in (("tensor count", n_tensors, _MIN_TENSOR_INFO_BYTES), ("metadata key count", n_kv,
                                                                              _MIN_KV_BYTES)):
        if n < 0:
            raise Invalid(what, n, "a count >= 0")
        if n * per > cur.remaining:
            raise Truncated(what, f"{n} runs past the end of the file ({cur.remaining} bytes left)")
    seen: set = set()
    decode = (lambda key: True) if decode_strings is True else decode_strings.__contains__
    kvs = tuple(_read_kv(cur, i, decode, seen) for i in range(n_kv))
    alignment = _alignment(kvs)
    infos, names = [], set()
    for i in range(n_tensors):
        infos.append(_read_tensor_info(cur, i, names))
    tensors = tuple(RawTensor(name, ne, raw_type, offset, _nbytes(name, ne, raw_type))
                    for name, ne, raw_type, offset in infos)
    data_offset = cur.pos
    if n_tensors > 0:
        data_offset = -(-cur.pos // alignment) * alignment
        if data_offset > len(buf):
            raise Truncated("data region", f"starts at byte {data_offset}, past the end of the file ({len(buf)} bytes)")
    return RawFile(version, kvs, tensors, alignment, data_offset, _data_size(tensors, alignment))


def _alignment(kvs: tuple[RawKV, ...]) -> int:
    kv = next((kv for kv in kvs if kv.key == "general.alignment"), None)
    if kv is None:
        return GGUF_DEFAULT_ALIGNMENT
    if kv.vtype != V.UINT32:
        raise Invalid("general.alignment", type_name(kv), "type u32 (gguf.cpp)")
    if kv.value == 0 or kv.value & (kv.value - 1):
        raise Invalid("general.alignment", kv.value, "a power of 2 (gguf.cpp)")
    return kv.value


def _data_size(tensors: tuple[RawTensor, ...], alignment: int) -> int:
    """gguf.cpp: tensors lie in file order, each at the padded end of the one before."""
    size = 0
    for t in tensors:
        if t.offset != size:
            raise Invalid(f"tensor '{t.name}' offset", t.offset, f"{size}, where the tensor before it ends (gguf.cpp)")
        if t.nbytes > SIZE_MAX - (alignment - 1):
            raise Invalid(f"tensor '{t.name}' size", t.nbytes, f"at most {SIZE_MAX - (alignment - 1)} bytes")
        padded = -(-t.nbytes // alignment) * alignment
        if SIZE_MAX - size < padded:
            raise Invalid(f"tensor '{t.name}' size", t.nbytes, "a data region smaller than 2^64 bytes")
        size += padded
    return size


def type_name(kv: RawKV) -> str:
    """The value's type as llama.cpp's messages print it ("u32", "arr[str,49152]")."""
    if kv.vtype == V.ARRAY:
        return Name(f"arr[{TYPE_NAMES[kv.sub_type]},{kv.count}]")
    return Name(TYPE_NAMES[kv.vtype])

