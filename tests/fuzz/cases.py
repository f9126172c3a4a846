"""Deterministic model files of every crash class the fuzzer (and the issue) found: each a seed
with one edit, named after what it breaks. tests/test_modelfile_regressions.py runs each through
both paths and checks the error names the field.
"""

from __future__ import annotations

import math
import struct
from typing import Callable

from .gguf_model import ARR, BOOL, F32, I32, STR, U32, KV, Model, encode_value


def set_kv(model: Model, key: str, vtype: int, value, sub_type: int = -1) -> Model:
    m = model.copy()
    kv = m.find(key)
    if kv is None:
        kv = KV(key, vtype, b"")
        m.kvs.append(kv)
    kv.vtype = vtype
    kv.payload, kv.sub_type, kv.count = encode_value(vtype, value, sub_type)
    return m


def set_type(model: Model, name: bytes, ggml_type: int) -> Model:
    m = model.copy()
    next(t for t in m.tensors if t.name == name).ggml_type = ggml_type
    return m


def _arch_key(model: Model, key: str) -> str:
    return f"{model.arch}.{key}"


def relabel(model: Model, arch: str) -> bytes:
    """The model named another architecture, its `{arch}.` keys renamed to match."""
    m = set_kv(model, "general.architecture", STR, arch.encode())
    old = model.arch
    for kv in m.kvs:
        if kv.key.startswith(old + "."):
            kv.key = arch + kv.key[len(old):]
    return m.to_bytes()


def _aligned(model: Model, alignment: int) -> bytes:
    """The data laid out at `alignment`, its start 8 bytes past a multiple of 32 (a padding key sees to it):
    where ggml-backend asserts "buffer pointer must be aligned"."""
    m = set_kv(model, "general.alignment", U32, alignment)
    m.alignment = alignment
    m = set_kv(m, "hypura.pad", STR, b"")
    m = set_kv(m, "hypura.pad", STR, b"x" * ((8 - len(m.header())) % 32))
    return m.to_bytes(relayout=True)


def _duplicate_token(model: Model) -> bytes:
    tokens = model.find("tokenizer.ggml.tokens").value()
    tokens[200] = tokens[100]
    return set_kv(model, "tokenizer.ggml.tokens", ARR, tokens, STR).to_bytes()


def _nul_token(model: Model) -> bytes:
    """A token that differs from another only past a NUL byte: llama.cpp reads token texts as C strings."""
    tokens = model.find("tokenizer.ggml.tokens").value()
    tokens[300] = tokens[100] + b"\0" + tokens[300]
    return set_kv(model, "tokenizer.ggml.tokens", ARR, tokens, STR).to_bytes()


def _eos_not_utf8(model: Model) -> bytes:
    """The EOS token's text cut inside a UTF-8 sequence: llama-cpp-python's Llama decodes it when it loads."""
    eos = model.find("tokenizer.ggml.eos_token_id").value()
    tokens = model.find("tokenizer.ggml.tokens").value()
    tokens[eos] = tokens[eos] + b"\xc3"
    return set_kv(model, "tokenizer.ggml.tokens", ARR, tokens, STR).to_bytes()


def _control_char_name(model: Model) -> bytes:
    """A tensor named with a control character, its row no multiple of its block: the message quotes
    the name, printable."""
    m = model.copy()
    t = next(t for t in m.tensors if t.name == b"blk.0.attn_q.weight")
    t.name, t.ne[0] = b"blk.0.attn_q.weigh\x01", 100
    return m.to_bytes()


def _tokens_retyped(model: Model) -> bytes:
    n = model.find("tokenizer.ggml.tokens").count
    return set_kv(model, "tokenizer.ggml.tokens", ARR, list(range(n)), I32).to_bytes()


def _short_scores(model: Model) -> bytes:
    n = model.find("tokenizer.ggml.tokens").count
    return set_kv(model, "tokenizer.ggml.scores", ARR, [0.0] * (n - 1), F32).to_bytes()


def _long_tensor_name(model: Model) -> bytes:
    """A tensor name whose length field says 62 million: within the file, so read, then far too long."""
    m = model.copy()
    raw = bytearray(m.to_bytes())
    start, _ = m.spans[f"tensor:{m.tensors[0].name.decode()}"]
    raw[start:start + 8] = struct.pack("<Q", min(62_000_000, len(raw) - start - 9))
    return bytes(raw)


def _renamed_tensor(model: Model) -> bytes:
    """A tensor llama.cpp needs renamed to one it does not know: only its loader notices."""
    m = model.copy()
    t = next(t for t in m.tensors if t.name == b"blk.0.attn_q.weight")
    t.name = b"blk.0.attn_x.weight"
    return m.to_bytes()


def _swapped_shape(model: Model) -> bytes:
    """ffn_up with its dimensions swapped: the same bytes, a shape llama.cpp's loader rejects."""
    m = model.copy()
    t = next(t for t in m.tensors if t.name == b"blk.0.ffn_up.weight")
    t.ne = [t.ne[1], t.ne[0]]
    return m.to_bytes()


def _special_missing(model: Model, tokenizer: bytes, which: str) -> bytes:
    """A tokenizer without a default for `which` (bos, eos), told to add it, its id outside the vocabulary:
    llama.cpp asserts at the first tokenize."""
    m = set_kv(model, "tokenizer.ggml.model", STR, tokenizer)
    m = set_kv(m, f"tokenizer.ggml.add_{which}_token", BOOL, True)
    return set_kv(m, f"tokenizer.ggml.{which}_token_id", U32, 4_000_000_000).to_bytes()


def _q2_0_weight(model: Model) -> bytes:
    """A matmul weight stored as GGML_TYPE_Q2_0 (42), which the vendored ggml computes with."""
    m = model.copy()
    t = next(t for t in m.tensors if t.name == b"blk.0.attn_output.weight")
    elements = math.prod(t.ne)
    m.data = bytes(m.data) + bytes(elements // 64 * 18)  # 64 elements a block, 18 bytes (ggml.c block_q2_0)
    t.ggml_type, t.offset, t.nbytes = 42, len(m.data) - elements // 64 * 18, elements // 64 * 18
    return m.to_bytes(relayout=True)


# name -> (seed, how to make it from the parsed seed, words the error must hold); words None: it must run
CASES: dict[str, tuple[str, Callable[[Model], bytes], object]] = {
    "alignment-1": ("tiny-llama", lambda m: _aligned(m, 1), "general.alignment is 1"),
    "alignment-16": ("tiny-qwen3moe", lambda m: _aligned(m, 16), "general.alignment is 16"),
    "alignment-string": ("tiny-llama", lambda m: set_kv(m, "general.alignment", STR, b"32").to_bytes(),
                         "general.alignment is str"),
    "alignment-array": ("tiny-llama", lambda m: set_kv(m, "general.alignment", ARR, [32], U32).to_bytes(),
                        "general.alignment is arr[u32,1]"),
    "block-count-0": ("tiny-llama", lambda m: set_kv(m, _arch_key(m, "block_count"), U32, 0).to_bytes(),
                      "llama.block_count is 0"),
    "block-count-huge": ("tiny-qwen3moe", lambda m: set_kv(m, _arch_key(m, "block_count"), U32, 4294967294).to_bytes(),
                         "qwen3moe.block_count is 4294967294"),
    "expert-used-huge": ("tiny-qwen3moe",
                         lambda m: set_kv(m, _arch_key(m, "expert_used_count"), U32, 2147483647).to_bytes(),
                         "qwen3moe.expert_used_count is 2147483647"),
    "tokens-duplicate": ("smollm2", _duplicate_token, "tokenizer.ggml.tokens[200]"),
    "tokens-nul": ("tiny-qwen3moe", _nul_token, "tokenizer.ggml.tokens[300]"),
    "tokens-retyped": ("tiny-llama", _tokens_retyped, "tokenizer.ggml.tokens is arr[i32,"),
    "scores-short": ("tiny-llama", _short_scores, "tokenizer.ggml.scores is arr[f32,"),
    "norm-i32": ("tiny-llama", lambda m: set_type(m, b"blk.1.attn_norm.weight", 26).to_bytes(),
                 "tensor 'blk.1.attn_norm.weight' type is i32"),
    "router-i32": ("tiny-qwen3moe", lambda m: set_type(m, b"blk.0.ffn_gate_inp.weight", 26).to_bytes(),
                   "tensor 'blk.0.ffn_gate_inp.weight' type is i32"),
    "rms-eps-negative": ("tiny-llama", lambda m: set_kv(m, _arch_key(m, "attention.layer_norm_rms_epsilon"), F32,
                                                        -1.0).to_bytes(), "layer_norm_rms_epsilon is -1.0"),
    "rms-eps-nan": ("tiny-qwen3moe", lambda m: set_kv(m, _arch_key(m, "attention.layer_norm_rms_epsilon"), F32,
                                                      math.nan).to_bytes(), "layer_norm_rms_epsilon is nan"),
    "rope-dims-not-head": ("tiny-qwen3moe", lambda m: set_kv(m, _arch_key(m, "rope.dimension_count"), U32,
                                                             64).to_bytes(), "qwen3moe.rope.dimension_count is 64"),
    "arch-needs-experts": ("tiny-llama", lambda m: relabel(m, "smallthinker"), "smallthinker.expert_count is 0"),
    "arch-without-kv-cache": ("tiny-llama", lambda m: relabel(m, "llada"), "architecture 'llada' generates no text"),
    "non-causal": ("tiny-llama", lambda m: set_kv(m, _arch_key(m, "attention.causal"), BOOL, False).to_bytes(),
                   "llama.attention.causal is false"),
    "context-length-u32-max": ("tiny-llama",
                               lambda m: set_kv(m, _arch_key(m, "context_length"), U32, 4294967294).to_bytes(),
                               "llama.context_length is 4294967294"),
    "control-char-name": ("tiny-llama", _control_char_name, "tensor 'blk.0.attn_q.weigh\\x01' row is 100"),
    "long-tensor-name": ("tiny-llama", _long_tensor_name, "tensor 0 name length is"),
    "missing-tensor": ("tiny-llama", _renamed_tensor, "tensor 'blk.0.attn_q.weight' not found"),
    "wrong-shape": ("tiny-llama", _swapped_shape, "tensor 'blk.0.ffn_up.weight' shape is"),
    "ffn-length-u32-max": ("tiny-llama", lambda m: set_kv(m, _arch_key(m, "feed_forward_length"), U32,
                                                          4294967294).to_bytes(), "from llama.embedding_length and"),
    "bos-outside-vocab": ("smollm2", lambda m: _special_missing(m, b"t5", "bos"),
                          "tokenizer.ggml.bos_token_id is 4000000000: expected a token id below 49152"),
    "eos-outside-vocab": ("tiny-llama", lambda m: _special_missing(m, b"gemma4", "eos"),
                          "tokenizer.ggml.eos_token_id is 4000000000: expected a token id below"),
    "rwkv-eos-outside-vocab": ("tiny-llama", lambda m: _special_missing(m, b"rwkv", "eos"),
                               "tokenizer.ggml.eos_token_id is 4000000000"),  # llama-cpp-python appended -1
    "eos-text-not-utf8": ("tiny-qwen3moe", _eos_not_utf8, "expected UTF-8 text (the EOS token's"),
    # valid, and must run with bounded memory: a training context of 2 billion, a Q2_0 weight; a chat template
    # that does not parse (read for a chat only, which raises TemplateError: tests/test_chat_template.py)
    "chat-template-syntax": ("smollm2", lambda m: set_kv(m, "tokenizer.chat_template", STR,
                                                         b"{% if messages %}{{ 'x' }").to_bytes(), None),
    "context-length-2e9": ("tiny-llama", lambda m: set_kv(m, _arch_key(m, "context_length"), U32,
                                                          2_000_000_000).to_bytes(), None),
    "q2_0-weight": ("tiny-llama", _q2_0_weight, None),
}
