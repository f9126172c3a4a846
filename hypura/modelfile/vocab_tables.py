"""The tokenizer tables checked as llama_vocab::impl::load reads them (src/llama-vocab.cpp).

load() throws on a missing or mistyped table (clean, but late), aborts when two tokens share a
text (GGML_ASSERT(id_to_token.size() == token_to_id.size())), and leaves traps for later: a
vocabulary type without a tokenizer aborts at the first tokenize (GGML_ASSERT(type !=
LLAMA_VOCAB_TYPE_NONE)), and an SPM vocabulary missing a byte token throws std::out_of_range out
of llama_tokenize (byte_to_token), which no C caller can catch; and a tokenizer that adds a BOS,
EOS or SEP token to every prompt aborts there (GGML_ASSERT(special_bos_id != LLAMA_TOKEN_NULL)) when
that token's id is outside the vocabulary and its tokenizer has no default for it; llama-cpp-python decodes
the BOS and EOS texts as UTF-8 when it loads. Each is checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import gguf

from hypura.modelfile.metadata import Meta
from hypura.modelfile.problems import Invalid, Name, Problem
from hypura.modelfile.reader import TYPE_NAMES, type_name

V = gguf.GGUFValueType

TOKENS, SCORES, TOKEN_TYPE = "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"
MERGES, MODEL, CHARSMAP = "tokenizer.ggml.merges", "tokenizer.ggml.model", "tokenizer.ggml.precompiled_charsmap"
SUPPRESS = "tokenizer.ggml.suppress_tokens"
DECODED_ARRAYS = frozenset({TOKENS})  # string arrays whose elements a check needs

# llama-vocab.cpp load(): tokenizer models it knows, and those it reads BPE merges for
_BPE_MODELS = ("gpt2", "hybriddna", "whitespace", "gemma4")
_MODELS = _BPE_MODELS + ("llama", "bert", "t5", "rwkv", "plamo2")
# "no_vocab"/"none" (no tokenizer) and "test" (a hash of the text) make a model that cannot
# tokenize a prompt: llama.cpp aborts (GGML_ASSERT(type != LLAMA_VOCAB_TYPE_NONE)) when asked to
_NO_TEXT_MODELS = ("no_vocab", "none", "test")
# vocabularies whose tokenizer falls back to byte tokens "<0xXX>" with std::map::at (byte_to_token)
_BYTE_TOKEN_MODELS = ("llama", "plamo2")
# load(): the special token ids each tokenizer defaults to (None: LLAMA_TOKEN_NULL) and whether it
# adds BOS, EOS to a prompt unless the file says otherwise. BPE's default to add a BOS depends on the
# pre-tokenizer (llama3, tekken, chameleon, gemma4 do): taken as adding one. WPM (bert) always adds BOS and SEP.
_SPECIAL_DEFAULTS = {  # model: ({"bos": id, "eos": id, "sep": id}, add_bos, add_eos)
    "llama": ({"bos": 1, "eos": 2, "sep": None}, True, False),
    "bert": ({"bos": 101, "eos": None, "sep": 102}, True, False),
    "gpt2": ({"bos": 11, "eos": 11, "sep": None}, True, False),
    "hybriddna": ({"bos": 11, "eos": 11, "sep": None}, True, False),
    "whitespace": ({"bos": 11, "eos": 11, "sep": None}, True, False),
    "gemma4": ({"bos": None, "eos": None, "sep": None}, True, False),
    "t5": ({"bos": None, "eos": 1, "sep": None}, False, True),
    "rwkv": ({"bos": None, "eos": None, "sep": None}, False, False),
    "plamo2": ({"bos": 1, "eos": 2, "sep": None}, False, False),
}
# these tokenize without special tokens; llama-cpp-python's completion still appends the EOS id when told
# to add one, and an EOS of LLAMA_TOKEN_NULL (-1) then fails llama_decode
_NO_SPECIAL_TOKENS = ("rwkv", "plamo2")
_SPECIAL_KEYS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
                 "sep": "tokenizer.ggml.seperator_token_id"}


def check_vocab(meta: Meta) -> int:
    """The vocabulary size, after the checks of llama_vocab::impl::load."""
    model = meta.scalar(MODEL, V.STRING, required=True)
    if model in _NO_TEXT_MODELS:
        raise Invalid(MODEL, model, "a tokenizer for text (Hypura runs prompts)")
    if model not in _MODELS:
        raise Invalid(MODEL, model, "one of llama.cpp's tokenizers: " + ", ".join(_MODELS))
    meta.scalar("tokenizer.ggml.pre", V.STRING)
    tokens = _array(meta, TOKENS, (V.STRING,), required=True)
    n_tokens = tokens.count
    if n_tokens < 1:
        raise Invalid(TOKENS, type_name(tokens), "at least one token")
    for key, types in ((SCORES, (V.INT32, V.FLOAT32)), (TOKEN_TYPE, (V.INT32,))):
        kv = _array(meta, key, types)
        if kv is not None and kv.count < n_tokens:
            raise Invalid(key, type_name(kv), f"at least one entry per token ({n_tokens})")
    _array(meta, SUPPRESS, (V.INT32,))
    if model in _BPE_MODELS and not (meta.scalar("tokenizer.ggml.pre", V.STRING) == "kimi-k2" and
                                     meta.find(MERGES) is None):
        _array(meta, MERGES, (V.STRING,), required=True)
    if model == "t5":
        _charsmap(meta)
    vocab_size = meta.u32("%s.vocab_size")
    if vocab_size is not None and vocab_size != n_tokens:  # Hypura's planner sizes the logits by it
        raise Invalid(meta.key("%s.vocab_size"), vocab_size, f"the tokenizer's {n_tokens} tokens")
    _special_tokens(meta, model, n_tokens)
    _special_texts(meta, model, tokens.items)
    texts = _unique_texts(tokens.items)
    if model in _BYTE_TOKEN_MODELS:
        _byte_tokens(texts, model)
    return n_tokens


@dataclass(frozen=True)
class FileVocab:
    """A file's tokenizer as llama.cpp's load() settles it, from the header alone (no weights): what a
    draft's compatibility with its target is decided on (hypura.speculative.vocab_match)."""

    kind: str  # the tokenizer model; BPE's variants as one ("bpe"), as llama_vocab_type sees them
    tokens: tuple[bytes, ...]  # the texts as llama_vocab_get_text returns them (C strings: cut at a NUL)
    add_bos: bool
    bos: Optional[int]
    add_eos: bool
    eos: Optional[int]


def file_vocab(meta: Meta) -> FileVocab:
    model = meta.scalar(MODEL, V.STRING, required=True)
    items = tuple(t.split(b"\0", 1)[0] for t in _array(meta, TOKENS, (V.STRING,), required=True).items)
    defaults = _SPECIAL_DEFAULTS.get(model, ({}, False, False))[0]
    adds = _added(meta, model)
    ids = {which: _effective_id(meta, which, defaults, len(items)) for which in ("bos", "eos")}
    return FileVocab("bpe" if model in _BPE_MODELS else model, items, adds["bos"], ids["bos"], adds["eos"], ids["eos"])


def _added(meta: Meta, model: str) -> dict[str, bool]:
    """Whether the tokenizer adds BOS, EOS, SEP to every prompt (the file's flags over its defaults)."""
    _, add_bos, add_eos = _SPECIAL_DEFAULTS.get(model, ({}, False, False))
    add_bos = meta.scalar("tokenizer.ggml.add_bos_token", V.BOOL, add_bos)
    if model == "gemma4" or meta.scalar("tokenizer.ggml.pre", V.STRING) == "gemma4":
        add_bos = True  # load(): forced for Gemma 4's pre-tokenizer
    return {"bos": (add_bos or model == "bert") and model not in _NO_SPECIAL_TOKENS,
            "eos": meta.scalar("tokenizer.ggml.add_eos_token", V.BOOL, add_eos), "sep": model == "bert"}


def _special_tokens(meta: Meta, model: str, n_tokens: int) -> None:
    """Each special token the tokenizer adds to a prompt has an id within the vocabulary: the file's
    when it is (llama.cpp ignores one outside), else the tokenizer's default when that is."""
    if model not in _SPECIAL_DEFAULTS:
        return
    defaults = _SPECIAL_DEFAULTS[model][0]
    for which, added in _added(meta, model).items():
        if not added:
            continue
        if _effective_id(meta, which, defaults, n_tokens) is not None:
            continue
        stated = meta.u32(_SPECIAL_KEYS[which])
        value = Name("missing") if stated is None else stated
        raise Invalid(_SPECIAL_KEYS[which], value, f"a token id below {n_tokens} (the {model} tokenizer adds "
                                                   f"{which.upper()} to every prompt)")


def _special_texts(meta: Meta, model: str, items: list[bytes]) -> None:
    """The BOS and EOS token texts are UTF-8: llama-cpp-python's Llama decodes both when it loads (strictly:
    a UnicodeDecodeError out of its constructor otherwise)."""
    defaults = _SPECIAL_DEFAULTS.get(model, ({}, False, False))[0]
    for which in ("bos", "eos"):
        token = _effective_id(meta, which, defaults, len(items))
        if token is None:
            continue
        text = items[token].split(b"\0", 1)[0]  # a C string, as llama_vocab_get_text returns it
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            raise Invalid(f"{TOKENS}[{token}]", text, f"UTF-8 text (the {which.upper()} token's, which "
                                                      f"llama-cpp-python decodes when it loads)") from None


def _effective_id(meta: Meta, which: str, defaults: dict, n_tokens: int) -> int | None:
    """The id llama.cpp uses for a special token: the file's when within the vocabulary (it ignores one
    outside), else the tokenizer's default when that is; None: LLAMA_TOKEN_NULL."""
    stated = meta.u32(_SPECIAL_KEYS[which])
    token = stated if stated is not None and stated < n_tokens else defaults.get(which)
    return token if token is not None and token < n_tokens else None


def _array(meta: Meta, key: str, types: tuple, required: bool = False):
    kv = meta.find(key)
    if kv is None:
        if required:
            raise Invalid(key, Name("missing"), "the tokenizer's table (llama.cpp requires it)")
        return None
    if kv.vtype != V.ARRAY or kv.sub_type not in types:
        names = " or ".join(f"arr[{TYPE_NAMES[t]}]" for t in types)
        raise Invalid(key, type_name(kv), f"type {names} (llama-vocab.cpp: invalid gguf type)")
    return kv


def _unique_texts(items: list[bytes]) -> set[bytes]:
    """The token texts as llama.cpp keys them, each once: read as C strings (gguf_get_arr_str), so cut at
    a NUL byte, and an empty one becomes "[EMPTY_<id>]"."""
    texts: dict[bytes, int] = {}
    for i, text in enumerate(items):
        text = text.split(b"\0", 1)[0] or f"[EMPTY_{i}]".encode()
        first = texts.setdefault(text, i)
        if first != i:
            raise Invalid(f"{TOKENS}[{i}]", text, f"a token text of its own (token {first} has it)")
    return set(texts)


def _byte_tokens(texts: set[bytes], model: str) -> None:
    for ch in range(256):
        if f"<0x{ch:02X}>".encode() not in texts and (model == "plamo2" or bytes([ch]) not in texts):
            raise Problem(f"{TOKENS} has no byte token <0x{ch:02X}>: expected one for every byte "
                          f"(the {model} tokenizer falls back to them)")


def _charsmap(meta: Meta) -> None:
    kv = meta.find(CHARSMAP)
    if kv is None:
        return
    if kv.vtype != V.ARRAY or kv.sub_type not in (V.INT8, V.UINT8):
        raise Invalid(CHARSMAP, type_name(kv), "type arr[i8] or arr[u8]")
    data = bytes(b & 0xFF for b in kv.items)
    blob = int.from_bytes(data[:4], "little") if len(data) >= 4 else None
    if blob is None or blob + 4 >= len(data):
        raise Invalid(CHARSMAP, type_name(kv), "an XCDA blob size within the array (llama-vocab.cpp)")
