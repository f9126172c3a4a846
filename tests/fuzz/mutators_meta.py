"""GGUF mutations of the metadata as a whole and of the file's extent: keys duplicated, dropped or
added, alignment values, counts and string lengths past the end, the file relabelled as another
architecture or tokenizer, values swapped between keys, truncations; and the registry of every
mutation kind with its weight in a campaign.
"""

from __future__ import annotations

import random
import struct

from . import mutators as m1
from .gguf_model import ARR, BOOL, STR, U32, KV, Model, encode_value


def duplicate_key(rng: random.Random, model: Model, raw: bytes):
    m = model.copy()
    kv = rng.choice(m.kvs)
    copy = KV(kv.key, kv.vtype, kv.payload, kv.sub_type, kv.count)
    m.kvs.insert(rng.randrange(len(m.kvs) + 1), copy)
    return f"key {kv.key} twice", m.to_chunks()


def drop_key(rng: random.Random, model: Model, raw: bytes):
    m = model.copy()
    kv = m.kvs.pop(rng.randrange(len(m.kvs)))
    return f"key {kv.key} dropped", m.to_chunks()


def add_key(rng: random.Random, model: Model, raw: bytes):
    """A key llama.cpp reads, added with an odd value (expert counts in a dense model, split counts...)."""
    m = model.copy()
    arch = m.arch
    key = rng.choice((f"{arch}.expert_count", f"{arch}.expert_used_count", f"{arch}.expert_group_count",
                      f"{arch}.nextn_predict_layers", f"{arch}.attention.key_length", f"{arch}.rope.scaling.type",
                      f"{arch}.attention.sliding_window", "split.count", "split.no", f"{arch}.vocab_size",
                      "tokenizer.ggml.suppress_tokens", "tokenizer.ggml.precompiled_charsmap",
                      f"{arch}.attention.causal", f"{arch}.pooling_type", f"{arch}.rope.dimension_count",
                      f"{arch}.attention.head_count_kv", f"{arch}.feed_forward_length", ""))
    if key.endswith("rope.scaling.type"):
        payload, sub, count, vtype = *encode_value(STR, rng.choice((b"yarn", b"longrope", b"bogus", b""))), STR
    elif key.endswith(("suppress_tokens", "precompiled_charsmap", "head_count_kv", "feed_forward_length")) and \
            rng.random() < 0.7:
        items = [rng.choice(m1.EXTREME_INTS[:12]) for _ in range(rng.choice((0, 1, 3, 30)))]
        sub = rng.choice((U32, 5, 1))  # u32, i32, i8
        items = [x if sub == U32 else x % 128 for x in items]
        (payload, sub, count), vtype = encode_value(ARR, items, sub), ARR
    else:
        value = rng.choice(m1.EXTREME_INTS[:16]) & 0xFFFF if key.startswith("split") else rng.choice(m1.EXTREME_INTS)
        vtype = 2 if key.startswith("split") and rng.random() < 0.7 else U32  # split keys are u16
        value &= (1 << (16 if vtype == 2 else 32)) - 1
        payload, sub, count = struct.pack("<H" if vtype == 2 else "<I", value), -1, 0
    existing = m.find(key)
    if existing is not None:
        m.kvs.remove(existing)
    m.kvs.append(KV(key, vtype, payload, sub, count))
    return f"key {key} added ({vtype})", m.to_chunks()


def alignment(rng: random.Random, model: Model, raw: bytes):
    """general.alignment set to an odd value, the data laid out again for it (or not)."""
    m = model.copy()
    value = rng.choice(m1.ALIGNMENTS)
    kv = m.find("general.alignment")
    if kv is None:
        kv = KV("general.alignment", U32, b"")
        m.kvs.append(kv)
    kv.vtype, kv.payload = U32, struct.pack("<I", value & 0xFFFFFFFF)
    valid = value and not value & (value - 1) and value <= 4096
    if valid:
        m.alignment = value
    return f"general.alignment = {value}", m.to_chunks(relayout=bool(valid) and rng.random() < 0.8)


def huge_count(rng: random.Random, model: Model, raw: bytes):
    """n_tensors, n_kv, an array count or a string length stated far past what the file holds."""
    m = model.copy()
    how = rng.choice(("n_tensors", "n_kv", "array", "string"))
    if how in ("n_tensors", "n_kv"):
        real = (len(m.tensors), len(m.kvs))
        big = rng.choice((1, 2, 1000, 2**31, 2**40, 2**63 - 1, -1))
        m.counts = (real[0] + big, real[1]) if how == "n_tensors" else (real[0], real[1] + big)
        return f"{how} + {big}", m.to_chunks()
    if how == "array":
        kv = rng.choice([kv for kv in m.kvs if kv.vtype == ARR])
        count = rng.choice((kv.count + 1, 2**30, 2**30 + 1, 2**32, 2**62))
        kv.payload = kv.payload[:4] + struct.pack("<Q", count) + kv.payload[12:]
        return f"{kv.key} count {count}", m.to_chunks()
    kv = rng.choice([kv for kv in m.kvs if kv.vtype == STR] or m.kvs)
    length = rng.choice((len(raw), 2**30, 2**30 + 1, 2**40, 2**64 - 1, 64 * 1000 * 1000))
    if kv.vtype == STR:
        kv.payload = struct.pack("<Q", length) + kv.payload[8:]
    return f"{kv.key} string length {length}", m.to_chunks()


def other_arch(rng: random.Random, model: Model, raw: bytes):
    """The file relabelled as another architecture, its `{arch}.` keys renamed to match (or not)."""
    m = model.copy()
    old, new = m.arch, rng.choice(m1.ARCHS)
    m.find("general.architecture").payload = encode_value(STR, new.encode())[0]
    if rng.random() < 0.8:
        for kv in m.kvs:
            if kv.key.startswith(old + "."):
                kv.key = new + kv.key[len(old):]
    return f"architecture {old} -> {new}", m.to_chunks()


def other_tokenizer(rng: random.Random, model: Model, raw: bytes):
    m = model.copy()
    new = rng.choice(m1.TOKENIZERS)
    key = "tokenizer.ggml.model" if new != "kimi-k2" else "tokenizer.ggml.pre"
    kv = m.find(key)
    kv.vtype, (kv.payload, kv.sub_type, kv.count) = STR, encode_value(STR, new.encode())
    if rng.random() < 0.3:  # without merges too
        m.kvs = [kv for kv in m.kvs if kv.key != "tokenizer.ggml.merges"]
    return f"{key} = {new!r}", m.to_chunks()


def special_tokens(rng: random.Random, model: Model, raw: bytes):
    """The special tokens a tokenizer adds to every prompt: the tokenizer swapped, BOS/EOS/SEP ids set
    outside the vocabulary or dropped, the add_bos/add_eos flags set."""
    m = model.copy()
    edits = []
    if rng.random() < 0.6:
        new = rng.choice(("t5", "gemma4", "bert", "llama", "gpt2", "rwkv", "plamo2"))
        kv = m.find("tokenizer.ggml.model")
        kv.vtype, (kv.payload, kv.sub_type, kv.count) = STR, encode_value(STR, new.encode())
        edits.append(f"tokenizer {new}")
    n_tokens = m.find("tokenizer.ggml.tokens").count
    for which in rng.sample(("bos", "eos", "seperator"), rng.randint(1, 3)):
        key = f"tokenizer.ggml.{which}_token_id"
        old = m.find(key)
        if old is not None:
            m.kvs.remove(old)
        if rng.random() < 0.75:
            value = rng.choice((n_tokens, n_tokens + 1, 2**31, 2**32 - 1, 0, 1, 101, 102))
            m.kvs.append(KV(key, U32, struct.pack("<I", value)))
            edits.append(f"{which}={value}")
        else:
            edits.append(f"{which} dropped")
    for which in rng.sample(("bos", "eos"), rng.randint(0, 2)):
        key, value = f"tokenizer.ggml.add_{which}_token", rng.random() < 0.7
        old = m.find(key)
        if old is not None:
            m.kvs.remove(old)
        m.kvs.append(KV(key, BOOL, struct.pack("<?", value)))
        edits.append(f"add_{which}={value}")
    return "; ".join(edits), m.to_chunks()


def swap_values(rng: random.Random, model: Model, raw: bytes):
    """Two keys exchange their values (and types)."""
    m = model.copy()
    a, b = rng.sample(m.kvs, 2)
    (a.vtype, a.payload, a.sub_type, a.count), (b.vtype, b.payload, b.sub_type, b.count) = \
        (b.vtype, b.payload, b.sub_type, b.count), (a.vtype, a.payload, a.sub_type, a.count)
    return f"values of {a.key} and {b.key} swapped", m.to_chunks()


def string_edit(rng: random.Random, model: Model, raw: bytes):
    """A string value or array element given a NUL byte (llama.cpp reads many as C strings), made
    empty, invalid UTF-8, long, or a copy of another."""
    m = model.copy()
    kv = rng.choice([kv for kv in m.kvs if kv.vtype == STR or (kv.vtype == ARR and kv.sub_type == STR)])
    items = kv.value() if kv.vtype == ARR else [kv.value().encode()]
    i = rng.randrange(len(items)) if items else 0
    if not items:
        return duplicate_key(rng, model, raw)
    how = rng.choice(("nul", "nul-prefix", "empty", "utf8", "long", "copy"))
    old = items[i]
    items[i] = {"nul": old[:1] + b"\0" + old[1:], "nul-prefix": b"\0" + old, "empty": b"", "utf8": old + b"\xc3",
                "long": old * 200 + b"x", "copy": items[rng.randrange(len(items))]}[how]
    if kv.vtype == ARR:
        kv.payload, kv.sub_type, kv.count = encode_value(ARR, items, STR)
    else:
        kv.payload = encode_value(STR, items[0])[0]
    return f"{kv.key}[{i}]: {how}", m.to_chunks()


def consistent_hparams(rng: random.Random, model: Model, raw: bytes):
    """Hyper-parameters changed to plausible values that may still fit the tensors: head counts that
    divide the width, even rope dimensions up to the head size, expert counts within the experts."""
    m = model.copy()
    arch = m.arch
    n_embd = m.find(f"{arch}.embedding_length").value()
    divisors = [d for d in range(1, n_embd + 1) if n_embd % d == 0]
    n_expert = m.find(f"{arch}.expert_count").value() if m.find(f"{arch}.expert_count") else 0
    choices = {
        "attention.head_count": divisors, "attention.head_count_kv": divisors,
        "attention.key_length": divisors, "attention.value_length": divisors,
        "rope.dimension_count": list(range(0, 257, 2)),
        "expert_used_count": list(range(0, n_expert + 1)) or [0, 1],
        "expert_group_count": [0, 1, 2, 4], "expert_group_used_count": [0, 1, 2],
        "nextn_predict_layers": [0, 1, 2], "attention.sliding_window": [0, 1, 4, 4096],
    }
    edits = []
    for key in rng.sample(list(choices), rng.randint(1, 3)):
        value = rng.choice(choices[key])
        found = m.find(f"{arch}.{key}")
        if found is not None:
            m.kvs.remove(found)
        m.kvs.append(KV(f"{arch}.{key}", U32, struct.pack("<I", value)))
        edits.append(f"{key}={value}")
    return "; ".join(edits), m.to_chunks()


def truncate(rng: random.Random, model: Model, raw: bytes):
    """The file cut: in the header, at the data region's start, inside or between tensors, one byte short."""
    header = model.spans["header"][1]
    data_start = len(raw) - len(model.data)
    t = rng.choice(model.tensors)
    end = rng.choice((rng.randrange(4, header), data_start, data_start + t.offset, data_start + t.offset + 1,
                      rng.randrange(data_start, len(raw)), len(raw) - 1, data_start - 1))
    return f"truncated to {end} of {len(raw)} bytes", [memoryview(raw)[:end]]


# (mutation, weight): the kinds (bit flips, overwrites, extreme integers, retyped and
# mismatched arrays, tensor types, truncations) weigh most
MUTATIONS = (
    (m1.bit_flips, 12), (m1.overwrites, 8), (m1.field_overwrite, 10), (m1.int_extreme, 12), (m1.float_odd, 5),
    (m1.retype, 10), (m1.array_edit, 10), (m1.tensor_type, 6), (m1.norm_type, 4), (m1.tensor_shape, 5),
    (m1.tensor_offset, 3), (m1.tensor_name, 5), (duplicate_key, 2), (drop_key, 3), (add_key, 5), (alignment, 4),
    (huge_count, 4), (other_arch, 3), (other_tokenizer, 3), (swap_values, 2), (truncate, 6), (string_edit, 5),
    (consistent_hparams, 6), (special_tokens, 4),
)


def mutate(rng: random.Random, model: Model, raw: bytes, kinds=None):
    """One mutation of a seed (of `kinds`, names of mutations, if given): (kind, description, the file as
    buffers to write in turn)."""
    funcs, weights = zip(*[(fn, w) for fn, w in MUTATIONS if kinds is None or fn.__name__ in kinds])
    fn = rng.choices(funcs, weights)[0]
    desc, data = fn(rng, model, raw)
    return fn.__name__, desc, data
