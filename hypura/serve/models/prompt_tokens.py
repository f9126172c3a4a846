"""Prompt text to tokens in bounded time: refused before tokenizing when it cannot fit the context, tokenized
in pieces that each cost little, and stopped between pieces (the client left, the server stops, the
prompt's deadline passed, the tokens filled the context).

llama.cpp splits a text at special tokens before tokenizing (`tokenizer_st_partition`), and each split
walks its fragment list from the start: N special tokens in a prompt cost N² steps (`"<|im_end|>x" * 32k`
took 20 s, 100k one-character chat messages over 5 minutes), in one call nothing can stop. Text can be cut
right after a special token that cannot overlap any special token (a "cutter": no special token contains
it or is contained in it, no suffix of one is a prefix of the other, and no RSTRIP attribute) without
changing the tokens: llama.cpp splits there itself, and tokenizes each fragment alone, the one after a
special token as the first of a text. So a long text is tokenized in pieces of about PIECE_CHARS cut
after cutters, each piece's BOS only in the first, and the tokens are the same as of one call
(tests/test_serve_tokenize.py compares them).

Before any of this a text longer than the context could hold at the vocabulary's longest token
(`n_ctx x max_token_bytes`) is refused, and tokenizing stops as soon as the tokens fill the context.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from hypura.serve.http.errors import ApiError

PIECE_CHARS = 2048  # a piece holds at most ~200 special tokens: its N² split costs well under a millisecond
_SPECIAL_ATTRS = (1 << 0) | (1 << 3) | (1 << 4)  # llama.cpp's UNKNOWN | CONTROL | USER_DEFINED
_RSTRIP = 1 << 8


class Cancelled(Exception):
    """The request that wanted these tokens is gone (its client left, or the server stops)."""


@dataclass(frozen=True)
class Vocab:
    """What bounding a tokenization needs to know of a model's vocabulary."""

    max_token_bytes: int  # the most text bytes one token covers (an upper bound)
    cutters: frozenset = frozenset()  # special-token texts text may be cut after (above)
    adds_eos: bool = False  # tokenizing with add_special appends EOS: then pieces are not joined


def _cutters(specials: dict[str, int]) -> frozenset:
    """The special tokens whose every occurrence llama.cpp splits at and strips nothing after (above)."""
    texts = [t for t in specials if t]
    prefixes = {t[:i] for t in texts for i in range(1, len(t) + 1)}
    suffixes = {t[i:] for t in texts for i in range(len(t))}
    joined = "\0".join(texts)
    out = set()
    for t in texts:
        if specials[t] & _RSTRIP or joined.count(t) > 1:  # RSTRIP, or inside another special token
            continue
        if any(t[i:] in prefixes or t[:i] in suffixes for i in range(1, len(t))):  # overlaps one (or itself)
            continue
        if any(t[i:j] in specials for i in range(len(t)) for j in range(i + 1, len(t) + 1) if j - i < len(t)):
            continue  # holds another
        out.add(t)
    return frozenset(out)


def read_vocab(llm) -> Vocab:
    """The Vocab of a loaded model or a hypura.Llama (llama.cpp's view of it: token texts and attributes)."""
    import llama_cpp

    vocab = llm.vocab.vocab  # llama_vocab *
    longest, specials = 1, {}
    for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        text = llama_cpp.llama_vocab_get_text(vocab, token) or b""
        longest = max(longest, len(text))  # the stored text is never shorter than the bytes it stands for
        attr = llama_cpp.llama_vocab_get_attr(vocab, token)
        if attr & _SPECIAL_ATTRS:
            specials[text.decode("utf-8", errors="replace")] = attr
    return Vocab(max_token_bytes=longest, cutters=_cutters(specials),
                 adds_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)))


def too_long(n_ctx: int, size: str) -> ApiError:
    """The 400 of a prompt of `size` ("601 tokens") that does not fit `n_ctx` (as generation.make_job's)."""
    return ApiError(400, f"the prompt is {size}, but the context is {n_ctx} tokens per request (prompt and "
                         "reply together): shorten it", "context_length_exceeded")


def check_chars(vocab: Vocab, n_ctx: int, chars: int) -> None:
    """Refuse text that cannot fit `n_ctx` tokens even at the longest token (chars <= bytes: a lower bound)."""
    if chars > n_ctx * vocab.max_token_bytes:
        raise too_long(n_ctx, f"{chars} characters, more than {n_ctx} tokens of at most {vocab.max_token_bytes} "
                              "bytes hold")


def tokenize(tokenize_fn: Callable[[str, bool, bool], list[int]], vocab: Vocab, text: str, add_special: bool,
             parse_special: bool, n_ctx: int, cancelled: threading.Event) -> list[int]:
    """`tokenize_fn(text, add_special, parse_special)` (the engine's) over `text` in pieces (above); raises
    ApiError 400 once the tokens fill `n_ctx`, Cancelled when `cancelled` is set."""
    check_chars(vocab, n_ctx, len(text))
    pieces = _pieces(text, vocab) if parse_special and not (add_special and vocab.adds_eos) else [text]
    out: list[int] = []
    for i, piece in enumerate(pieces):
        if cancelled.is_set():
            raise Cancelled()
        out += tokenize_fn(piece, add_special and i == 0, parse_special)
        if len(out) >= n_ctx:
            raise too_long(n_ctx, f"{'at least ' if i < len(pieces) - 1 else ''}{len(out)} tokens")
    return out


def _pieces(text: str, vocab: Vocab) -> list[str]:
    """`text` cut after cutters into pieces of about PIECE_CHARS (one piece when it has no cutter)."""
    if len(text) <= PIECE_CHARS:
        return [text]
    present = [t for t in vocab.cutters if t in text]
    following = {t: text.find(t) for t in present}  # the next occurrence of each, from the last cut on
    pieces, start = [], 0
    while len(text) - start > PIECE_CHARS:
        target = start + PIECE_CHARS
        cut = len(text)
        for t in present:
            at = following[t]
            if 0 <= at < target:
                at = following[t] = text.find(t, target - len(t) + 1)
            if at >= 0:
                cut = min(cut, at + len(t))
        pieces.append(text[start:cut])
        start = cut
    if start < len(text):
        pieces.append(text[start:])
    return pieces
