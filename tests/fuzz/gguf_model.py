"""A GGUF file as the fuzzer edits it: header entries as byte spans, tensors, the data region.

Its own small parser, on purpose apart from hypura.modelfile (the code under test): it reads the
valid seed files only, recording where every field lies so that mutators can flip, overwrite,
retype, duplicate or drop them, then writes the file back (`to_bytes`), optionally laying the
data region out again for another alignment.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

# GGUF value types (gguf.h enum gguf_type) and their struct codes
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
CODES = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q",
         F64: "d"}


@dataclass
class KV:
    key: str
    vtype: int
    payload: bytes  # everything after the type field: the value, or sub-type, count and elements
    sub_type: int = -1
    count: int = 0

    def value(self):
        """A scalar's value, a string's text, or an array's elements (strings as bytes)."""
        if self.vtype == STR:
            return self.payload[8:].decode("utf-8", "replace")
        if self.vtype != ARR:
            return struct.unpack("<" + CODES[self.vtype], self.payload)[0]
        return decode_items(self.sub_type, self.count, self.payload[12:])

    def blob(self) -> bytes:
        key = self.key.encode()
        return struct.pack("<Q", len(key)) + key + struct.pack("<I", self.vtype & (2**32 - 1)) + self.payload


@dataclass
class Tensor:
    name: bytes
    ne: list[int]
    ggml_type: int
    offset: int  # relative to the data region
    nbytes: int  # in the seed (for laying the data out again)
    n_dims: int = -1  # as written; -1: len(ne)

    def blob(self) -> bytes:
        n_dims = len(self.ne) if self.n_dims < 0 else self.n_dims
        u32, u64 = 2**32 - 1, 2**64 - 1  # fields as the file holds them, whatever a mutation made them
        return (struct.pack("<Q", len(self.name)) + self.name + struct.pack("<I", n_dims & u32)
                + b"".join(struct.pack("<Q", n & u64) for n in self.ne)
                + struct.pack("<IQ", self.ggml_type & u32, self.offset & u64))


@dataclass
class Model:
    version: int
    kvs: list[KV]
    tensors: list[Tensor]
    data: bytes  # the data region of the seed
    alignment: int = 32
    counts: tuple = ()  # (n_tensors, n_kv) written instead of the real ones, when set
    spans: dict = field(default_factory=dict)  # where fields lie in the seed: name -> (offset, size)

    def copy(self) -> "Model":
        return replace(self, kvs=[replace(kv) for kv in self.kvs], tensors=[replace(t, ne=list(t.ne))
                                                                           for t in self.tensors])

    def find(self, key: str):
        return next((kv for kv in self.kvs if kv.key == key), None)

    @property
    def arch(self) -> str:
        return self.find("general.architecture").value()

    def header(self) -> bytes:
        n_tensors, n_kv = self.counts or (len(self.tensors), len(self.kvs))
        mask = 2**64 - 1  # counts are written as the file's 64-bit fields, whatever a mutation made them
        parts = [b"GGUF", struct.pack("<IQQ", self.version, n_tensors & mask, n_kv & mask)]
        parts += [kv.blob() for kv in self.kvs] + [t.blob() for t in self.tensors]
        return b"".join(parts)

    def to_chunks(self, relayout: bool = False) -> list:
        """The file as buffers to write one after the other: header, padding to the alignment, the
        data region (laid out again, packed at the alignment, when `relayout`; else the seed's own
        bytes, not copied: a 100 MB seed costs no copy per case)."""
        data = memoryview(self.data)
        if relayout:
            chunks, pos = [], 0
            for t in self.tensors:
                chunk = data[t.offset:t.offset + t.nbytes]
                t.offset = pos
                pad = -len(chunk) % self.alignment
                chunks += [chunk, bytes(pad)]
                pos += len(chunk) + pad
            data = memoryview(b"".join(chunks))
        head = self.header()
        return [head + bytes(-len(head) % self.alignment), data]

    def to_bytes(self, relayout: bool = False) -> bytes:
        return b"".join(self.to_chunks(relayout))


def decode_items(sub_type: int, count: int, raw: bytes) -> list:
    if sub_type == STR:
        items, pos = [], 0
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", raw, pos)
            items.append(raw[pos + 8:pos + 8 + n])
            pos += 8 + n
        return items
    return list(struct.unpack(f"<{count}{CODES[sub_type]}", raw[:count * struct.calcsize(CODES[sub_type])]))


def encode_value(vtype: int, value, sub_type: int = -1) -> tuple[bytes, int, int]:
    """(payload, sub_type, count) of a value written as `vtype` (arrays: a list of `sub_type`)."""
    if vtype == STR:
        raw = value if isinstance(value, bytes) else str(value).encode()
        return struct.pack("<Q", len(raw)) + raw, -1, 0
    if vtype != ARR:
        return struct.pack("<" + CODES[vtype], value), -1, 0
    if sub_type == STR:
        body = b"".join(encode_value(STR, v)[0] for v in value)
    else:
        body = struct.pack(f"<{len(value)}{CODES[sub_type]}", *value)
    return struct.pack("<iQ", sub_type, len(value)) + body, sub_type, len(value)


_TYPE_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
               11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 26: (1, 4), 30: (1, 2)}


def parse(data: bytes) -> Model:
    """A valid seed file."""
    pos = 4
    version, n_tensors, n_kv = struct.unpack_from("<Iqq", data, pos)
    spans = {"version": (4, 4), "n_tensors": (8, 8), "n_kv": (16, 8)}
    pos = 24
    kvs = []
    for i in range(n_kv):
        start = pos
        (n,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        (vtype,) = struct.unpack_from("<i", data, pos)
        pos += 4
        vstart = pos
        sub, count = -1, 0
        if vtype == STR:
            (n,) = struct.unpack_from("<Q", data, pos)
            pos += 8 + n
        elif vtype == ARR:
            sub, count = struct.unpack_from("<iQ", data, pos)
            pos += 12
            if sub == STR:
                for _ in range(count):
                    (n,) = struct.unpack_from("<Q", data, pos)
                    pos += 8 + n
            else:
                pos += count * struct.calcsize(CODES[sub])
        else:
            pos += struct.calcsize(CODES[vtype])
        kvs.append(KV(key, vtype, data[vstart:pos], sub, count))
        spans[f"kv:{key}"] = (start, pos - start)
    tensors = []
    for i in range(n_tensors):
        start = pos
        (n,) = struct.unpack_from("<Q", data, pos)
        name = data[pos + 8:pos + 8 + n]
        pos += 8 + n
        (n_dims,) = struct.unpack_from("<I", data, pos)
        ne = list(struct.unpack_from(f"<{n_dims}q", data, pos + 4))
        pos += 4 + 8 * n_dims
        ggml_type, offset = struct.unpack_from("<iQ", data, pos)
        pos += 12
        block, size = _TYPE_SIZES[ggml_type]
        elements = 1
        for d in ne:
            elements *= d
        tensors.append(Tensor(name, ne, ggml_type, offset, elements // block * size))
        spans[f"tensor:{name.decode()}"] = (start, pos - start)
    alignment = 32
    for kv in kvs:
        if kv.key == "general.alignment":
            alignment = kv.value()
    spans["header"] = (0, pos)
    data_start = pos + (-pos % alignment)
    return Model(version, kvs, tensors, memoryview(data)[data_start:], alignment, spans=spans)
