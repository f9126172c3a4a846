"""Tokenizer metadata for synthetic models: every `tokenizer.*` KV of the default model
(SmolLM2-135M-Instruct, GPT-2 style BPE, ChatML template), resized to the shape's vocabulary so
token_embd/output have the real model's byte size.

Padding tokens are `[PADn]` of type UNUSED (score 0), as convert_hf_to_gguf pads vocabularies.
A smaller vocabulary (Mixtral's 32000) keeps the first ids (special tokens and bytes come
first) and drops the merges that would produce or use a dropped token."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

from gguf import GGUFValueType, TokenType

from hypura.errors import HypuraError
from hypura.models import default_model_path
from hypura.modelfile import KV, read_kv

TOKENS = "tokenizer.ggml.tokens"
TOKEN_TYPE = "tokenizer.ggml.token_type"
SCORES = "tokenizer.ggml.scores"
MERGES = "tokenizer.ggml.merges"
MIN_VOCAB = 512  # special tokens + the 256 byte tokens must survive truncation


@functools.lru_cache(maxsize=2)
def _source_kv(source: Optional[Path]) -> tuple[KV, ...]:
    kvs = tuple(kv for kv in read_kv(source or default_model_path()) if kv.key.startswith("tokenizer."))
    if not any(kv.key == TOKENS for kv in kvs):
        raise HypuraError(f"{source} has no tokenizer to copy")
    return kvs


def tokenizer_kv(n_vocab: int, source: Optional[Path] = None) -> list[KV]:
    """`source`: a GGUF to take the tokenizer from (default: the default model's)."""
    if n_vocab < MIN_VOCAB:
        raise HypuraError(f"vocabulary of {n_vocab} tokens is too small (min {MIN_VOCAB})")
    kvs = _source_kv(Path(source) if source else None)
    tokens = next(kv.value for kv in kvs if kv.key == TOKENS)
    n_pad = max(0, n_vocab - len(tokens))
    padding = {
        TOKENS: [f"[PAD{i}]" for i in range(len(tokens), n_vocab)],
        TOKEN_TYPE: [int(TokenType.UNUSED)] * n_pad,
        SCORES: [0.0] * n_pad,
    }
    out = []
    for kv in kvs:
        value = kv.value
        if kv.key in padding:
            value = list(value[:n_vocab]) + padding[kv.key]
        elif kv.key == MERGES and n_vocab < len(tokens):
            kept = set(tokens[:n_vocab])
            value = [m for m in value if _merge_kept(m, kept)]
        elif kv.vtype == GGUFValueType.UINT32 and kv.key.endswith("_token_id") and value >= n_vocab:
            continue  # a special token that no longer exists
        out.append(KV(kv.key, value, kv.vtype, kv.sub_type))
    return out


def _merge_kept(merge: str, kept: set[str]) -> bool:
    left, _, right = merge.partition(" ")
    return left in kept and right in kept and left + right in kept
