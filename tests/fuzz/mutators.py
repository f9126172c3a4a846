"""GGUF mutations: each takes a random source, a parsed seed and its bytes, and returns a short
description and the mutated file. Byte-level ones flip or overwrite bits of the header and the
tensor-info table; structural ones edit fields (extreme integers, odd floats, retyped and resized
arrays, wrong tensor types, shapes and offsets, duplicate keys and names, alignment values, huge
counts, strings running past the end, other architectures and tokenizers) and write the file
back; truncations cut it anywhere.
"""

from __future__ import annotations

import math
import random
import struct

from .gguf_model import ARR, BOOL, CODES, F32, F64, I32, I64, STR, U8, U16, U32, U64, Model, encode_value

EXTREME_INTS = (0, 1, 2, 3, 7, 8, 16, 31, 32, 33, 64, 255, 256, 511, 512, 513, 1023, 1024, 1025, 65535, 65536,
                2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1)
ODD_FLOATS = (-1.0, -0.0, 0.0, 1e-45, 1e-30, 1e30, 3.4e38, math.inf, -math.inf, math.nan, 1.0, 2.0, -1e-6)
# general.alignment values: not powers of two, too small for ggml-backend (1, 16), huge
ALIGNMENTS = (0, 1, 2, 3, 4, 8, 16, 24, 31, 33, 48, 64, 128, 4096, 2**20, 2**31, 2**32 - 1)
# architectures and tokenizers llama.cpp knows, to relabel a file with
ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe", "gemma", "gemma2", "gemma3", "phi3", "mistral3",
         "granite", "deepseek2", "falcon", "gpt2", "bert", "mamba", "rwkv6", "t5", "olmoe", "starcoder2",
         "command-r", "internlm2", "minicpm", "gptneox", "bloom", "stablelm", "nemotron", "exaone", "smollm3")
TOKENIZERS = ("llama", "gpt2", "bert", "t5", "rwkv", "plamo2", "gemma4", "whitespace", "hybriddna", "none",
              "no_vocab", "test", "kimi-k2", "")
TYPE_VALUES = list(range(0, 46)) + [-1, 2**31 - 1, 2**31]


def _header_end(model: Model) -> int:
    return model.spans["header"][1]


def _header_and_rest(model: Model, raw: bytes):
    """A copy of the header to edit, and the rest of the file as it is (not copied)."""
    end = _header_end(model)
    return bytearray(raw[:end]), memoryview(raw)[end:]


def bit_flips(rng: random.Random, model: Model, raw: bytes):
    """Flip 1-8 random bits of the header (metadata and tensor-info table)."""
    data, rest = _header_and_rest(model, raw)
    end = _header_end(model)
    flips = []
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(4, end)  # the magic stays: a non-GGUF file is the trivial case
        bit = rng.randrange(8)
        data[pos] ^= 1 << bit
        flips.append(f"{pos}:{bit}")
    return f"bit flips {','.join(flips)}", [data, rest]


def overwrites(rng: random.Random, model: Model, raw: bytes):
    """Overwrite 1-8 bytes somewhere in the header with random or extreme bytes."""
    data, rest = _header_and_rest(model, raw)
    end = _header_end(model)
    pos = rng.randrange(4, end - 8)
    n = rng.randint(1, 8)
    fill = rng.choice((lambda: bytes(rng.randrange(256) for _ in range(n)), lambda: b"\xff" * n,
                       lambda: b"\x00" * n, lambda: b"\x7f" + b"\xff" * (n - 1)))()
    data[pos:pos + n] = fill
    return f"overwrite {n} bytes at {pos} with {fill.hex()}", [data, rest]


def field_overwrite(rng: random.Random, model: Model, raw: bytes):
    """Set an integer field of a KV entry or a tensor info (its lengths, type, count, value) to an extreme."""
    spans = [(k, v) for k, v in model.spans.items() if k.startswith(("kv:", "tensor:"))]
    spans += [("version", model.spans["version"]), ("n_tensors", model.spans["n_tensors"]),
              ("n_kv", model.spans["n_kv"])]
    name, (start, size) = rng.choice(spans)
    width = rng.choice((4, 8)) if size >= 8 else 4
    pos = start + rng.randrange(0, max(1, size - width + 1)) if size > width else start
    value = rng.choice(EXTREME_INTS) & ((1 << (8 * width)) - 1)
    data, rest = _header_and_rest(model, raw)
    data[pos:pos + width] = value.to_bytes(width, "little")
    return f"{name}: {width}-byte field at {pos} = {value}", [data, rest]


def _numeric_kvs(model: Model, *types):
    return [kv for kv in model.kvs if kv.vtype in types]


def int_extreme(rng: random.Random, model: Model, raw: bytes):
    """An integer metadata value (block_count, context_length, heads, experts, token ids...) set to an extreme."""
    kvs = _numeric_kvs(model, U8, U16, U32, I32, U64, I64) or model.kvs
    m = model.copy()
    kv = m.find(rng.choice(kvs).key)
    if kv.vtype not in CODES or kv.vtype in (F32, F64, BOOL):
        return retype(rng, model, raw)
    bits = 8 * struct.calcsize(CODES[kv.vtype])
    value = rng.choice(EXTREME_INTS) & ((1 << bits) - 1)
    if CODES[kv.vtype].islower() and value >= 1 << (bits - 1):
        value -= 1 << bits
    kv.payload = struct.pack("<" + CODES[kv.vtype], value)
    return f"{kv.key} = {value}", m.to_chunks()


def float_odd(rng: random.Random, model: Model, raw: bytes):
    """A float value (epsilons, rope bases, scales) set to a negative, huge, infinite or NaN value."""
    kvs = _numeric_kvs(model, F32, F64)
    if not kvs:
        return int_extreme(rng, model, raw)
    m = model.copy()
    kv = m.find(rng.choice(kvs).key)
    value = rng.choice(ODD_FLOATS)
    kv.payload = struct.pack("<" + CODES[kv.vtype], value)
    return f"{kv.key} = {value}", m.to_chunks()


def _some_value(rng: random.Random, vtype: int, old):
    if vtype == STR:
        return rng.choice((b"", b"x", b"\x00\xff", str(old).encode()[:40]))
    if vtype in (F32, F64):
        return rng.choice(ODD_FLOATS + (float(old) if isinstance(old, (int, float)) else 1.0,))
    if vtype == BOOL:
        return rng.choice((True, False))
    bits = 8 * struct.calcsize(CODES[vtype])
    if isinstance(old, int) and rng.random() < 0.5:
        value = old
    else:
        value = rng.choice(EXTREME_INTS)
    value &= (1 << bits) - 1
    if CODES[vtype].islower() and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def retype(rng: random.Random, model: Model, raw: bytes):
    """A metadata value written as another type: another scalar, a string, an array (of one or
    several), or an array made a scalar; or only the type tag changed (the payload misread)."""
    m = model.copy()
    kv = rng.choice(m.kvs)
    if rng.random() < 0.25:  # the tag alone: the payload is then read as the new type
        new = rng.choice(list(range(13)) + [13, -1, 2**31 - 1])
        kv.vtype = new
        return f"{kv.key}: type tag -> {new}", m.to_chunks()
    old = kv.value() if kv.vtype != ARR else kv.value()[:4]
    target = rng.choice([U8, U16, U32, I32, F32, BOOL, STR, U64, I64, F64, ARR, ARR])
    if target == ARR:
        sub = rng.choice([U32, I32, F32, STR, U8, BOOL])
        n = rng.choice((0, 1, 2, 5))
        items = [_some_value(rng, sub, old if not isinstance(old, list) else 0) for _ in range(n)]
        kv.payload, kv.sub_type, kv.count = encode_value(ARR, items, sub)
        kv.vtype = ARR
        return f"{kv.key}: -> arr[{sub}] of {n}", m.to_chunks()
    value = _some_value(rng, target, old[0] if isinstance(old, list) and old else old)
    kv.payload, kv.sub_type, kv.count = encode_value(target, value)
    kv.vtype = target
    return f"{kv.key}: -> type {target} = {value!r}"[:200], m.to_chunks()


def array_edit(rng: random.Random, model: Model, raw: bytes):
    """Tokenizer tables (and other arrays) made inconsistent: cut, extended, elements retyped,
    duplicated, emptied or corrupted."""
    arrays = [kv for kv in model.kvs if kv.vtype == ARR]
    m = model.copy()
    kv = m.find(rng.choice(arrays).key)
    items = kv.value()
    how = rng.choice(("cut", "extend", "retype", "duplicate", "empty-item", "long-item", "count-only", "swap"))
    if how == "cut":
        items = items[:rng.choice((0, 1, len(items) // 2, max(0, len(items) - 1)))]
    elif how == "extend":
        items = items + items[:rng.choice((1, 7, 300))]
    elif how == "retype":
        sub = rng.choice([t for t in (U32, I32, F32, STR, U8, I64, F64, BOOL) if t != kv.sub_type])
        items = [_some_value(rng, sub, 0) for _ in items] if len(items) < 4096 else \
            [_some_value(rng, sub, 0)] * len(items)
        kv.sub_type = sub
    elif how == "duplicate" and len(items) > 1:
        i, j = rng.randrange(len(items)), rng.randrange(len(items))
        items[i] = items[j]
        how = f"duplicate [{j}] at [{i}]"
    elif how == "empty-item" and kv.sub_type == STR and items:
        i = rng.randrange(len(items))
        items[i] = rng.choice((b"", b"[EMPTY_%d]" % rng.randrange(len(items))))
        how = f"empty [{i}]"
    elif how == "long-item" and kv.sub_type == STR and items:
        items[rng.randrange(len(items))] = bytes(rng.randrange(1, 256) for _ in range(rng.choice((64, 300, 5000))))
    elif how == "count-only":
        payload = bytearray(kv.payload)
        count = rng.choice(EXTREME_INTS)
        payload[4:12] = struct.pack("<Q", count)
        kv.payload = bytes(payload)
        return f"{kv.key}: count field = {count}", m.to_chunks()
    elif how == "swap" and len(items) > 1:
        i, j = rng.randrange(len(items)), rng.randrange(len(items))
        items[i], items[j] = items[j], items[i]
    kv.payload, kv.sub_type, kv.count = encode_value(ARR, items, kv.sub_type)
    return f"{kv.key}: {how}", m.to_chunks()


def tensor_type(rng: random.Random, model: Model, raw: bytes):
    """A tensor's ggml type changed: any number, or one of the same byte size (F32 <-> I32, F16 <-> BF16)."""
    m = model.copy()
    t = rng.choice(m.tensors)
    same_size = {0: (26,), 26: (0,), 1: (30, 25), 30: (1, 25)}
    if t.ggml_type in same_size and rng.random() < 0.6:
        new = rng.choice(same_size[t.ggml_type])
    else:
        new = rng.choice(TYPE_VALUES)
    old, t.ggml_type = t.ggml_type, new
    return f"tensor {t.name.decode()} type {old} -> {new}", m.to_chunks()


def norm_type(rng: random.Random, model: Model, raw: bytes):
    """A norm or router weight retyped to an integer type of the same size (F32 -> I32)."""
    m = model.copy()
    picks = [t for t in m.tensors if t.ggml_type == 0]
    t = rng.choice(picks or m.tensors)
    old, t.ggml_type = t.ggml_type, rng.choice((26, 26, 1, 30, 24, 28))
    return f"tensor {t.name.decode()} type {old} -> {t.ggml_type}", m.to_chunks(relayout=True) if \
        t.ggml_type not in (0, 26) else m.to_chunks()


def tensor_shape(rng: random.Random, model: Model, raw: bytes):
    """A tensor's shape changed: a dimension set to an extreme, swapped, a dimension added or dropped."""
    m = model.copy()
    t = rng.choice(m.tensors)
    how = rng.choice(("extreme", "swap", "add", "drop", "ndims"))
    if how == "extreme" or len(t.ne) < 2 and how == "swap":
        t.ne[rng.randrange(len(t.ne))] = rng.choice(EXTREME_INTS[:20] + (-1, -2**63))
    elif how == "swap":
        t.ne[0], t.ne[1] = t.ne[1], t.ne[0]
    elif how == "add":
        t.ne.append(rng.choice((1, 2, 0)))
    elif how == "drop" and len(t.ne) > 1:
        t.ne.pop()
    else:
        t.n_dims = rng.choice((0, 5, 2**31))
    return f"tensor {t.name.decode()} {how} -> {t.ne} (n_dims {t.n_dims})", m.to_chunks()


def tensor_offset(rng: random.Random, model: Model, raw: bytes):
    """A tensor's data offset moved: by the alignment, to another tensor's, to an extreme."""
    m = model.copy()
    t = rng.choice(m.tensors)
    other = rng.choice(m.tensors)
    t.offset = rng.choice((t.offset + m.alignment, max(0, t.offset - m.alignment), other.offset, t.offset + 1,
                           rng.choice(EXTREME_INTS)))
    return f"tensor {t.name.decode()} offset -> {t.offset}", m.to_chunks()


def tensor_name(rng: random.Random, model: Model, raw: bytes):
    """A tensor renamed: to another's name (a duplicate), too long, with NUL or invalid UTF-8, a
    layer that does not exist; or a tensor info duplicated or dropped."""
    m = model.copy()
    i = rng.randrange(len(m.tensors))
    t = m.tensors[i]
    how = rng.choice(("duplicate-name", "long", "nul", "utf8", "layer", "dup-info", "drop", "empty"))
    if how == "duplicate-name":
        t.name = rng.choice(m.tensors).name
    elif how == "long":
        t.name = b"blk.0." + b"x" * rng.choice((57, 58, 64, 200, 70000))
    elif how == "nul":
        t.name = t.name[:3] + b"\x00" + t.name[3:]
    elif how == "utf8":
        t.name = t.name[:-1] + b"\xff"
    elif how == "layer":
        t.name = (t.name.replace(b"blk.0.", b"blk.999.", 1) if t.name.startswith(b"blk.0.")
                  else b"blk.%d." % 2**31 + t.name)
    elif how == "dup-info":
        m.tensors.insert(i, t.__class__(t.name, list(t.ne), t.ggml_type, t.offset, t.nbytes))
        return f"tensor info {t.name.decode()} duplicated", m.to_chunks(relayout=rng.random() < 0.5)
    elif how == "drop":
        m.tensors.pop(i)
        return f"tensor {t.name.decode()} dropped", m.to_chunks(relayout=rng.random() < 0.7)
    else:
        t.name = b""
    return f"tensor {i} renamed {how}: {t.name[:40]!r}", m.to_chunks()
