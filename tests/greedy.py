"""Greedy output compared across two ways of computing it, only as far as the CPU's kernels cannot decide it.

Two paths through llama.cpp (one token a decode; a speculative pass of several; a batch of sequences) compute a
position's logits with other kernels (tinyBLAS for 2+ rows, ggml's vec_dot for one, flash attention's tiled path
from 64 rows, repacked gemm against gemv), whose last bits differ, and differ again on another CPU (AVX-512,
NEON). Where a position's top two logits are that close, which token wins is the CPU's choice, not the code's:
the tree's greedy text read `return a * b` on an AMD EPYC where plain decoding's read `return a + b`. So a
comparison holds up to the reference's first near-tie (MARGIN) and no further, and asserts how many tokens that
was: a prompt whose continuation is decided for long (COUNTING) compares many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import llama_cpp
import numpy as np

# logits: twice the largest change of a position's top-two gap measured between two paths on the CPU VM (0.49;
# SmolLM2, one-token decoding against passes of 9, 33 and all tokens, flash attention on and off, three prompts),
# though single logits moved by up to 1.44
MARGIN = 1.0
# a continuation SmolLM2 keeps decided (every gap >= MARGIN) for 64 tokens, with flash attention on or off
COUNTING = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"


@dataclass(frozen=True)
class Greedy:
    """One-token decoding's greedy continuation: its tokens (an end of generation ends them, not kept) and, at
    each step, the top logit less the runner-up's."""

    tokens: tuple[int, ...]
    gaps: tuple[float, ...]
    pieces: tuple[bytes, ...]  # each token's text

    def first(self, n: int) -> "Greedy":
        """The first n steps (a completion of max_tokens n)."""
        return Greedy(self.tokens[:n], self.gaps[:n], self.pieces[:n])

    @property
    def decided(self) -> int:
        """Steps before the first near-tie: the tokens any CPU's kernels agree on."""
        return next((i for i, gap in enumerate(self.gaps) if gap < MARGIN), len(self.gaps))

    @property
    def all_decided(self) -> bool:
        return self.decided == len(self.gaps)


def greedy(llm, prompt: Sequence[int], n: int) -> Greedy:
    """`llm`'s greedy continuation of the token ids `prompt`, up to n tokens, one token a decode (its KV is
    reset before and after)."""
    llm.reset()
    llm.eval(list(prompt))
    tokens, gaps = [], []
    for _ in range(n):
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        second, first = np.partition(row, -2)[-2:]
        token = int(np.argmax(row))
        gaps.append(float(first - second))
        if llama_cpp.llama_vocab_is_eog(llm.vocab.vocab, token):
            break
        tokens.append(token)
        llm.eval([token])
    llm.reset()
    return Greedy(tuple(tokens), tuple(gaps), tuple(llm.detokenize([t]) for t in tokens))


def _compared(want: Greedy, at_least: int) -> int:
    k = min(want.decided, len(want.tokens))
    assert k >= at_least, f"only {k} tokens before a near-tie (gaps {want.gaps[:k + 1]}): a prompt decided longer"
    return k


def decided_text(want: Greedy, at_least: int) -> bytes:
    """`want`'s text up to its first near-tie, which holds at least `at_least` tokens."""
    return b"".join(want.pieces[:_compared(want, at_least)])


def assert_same_tokens(got: Sequence[int], want: Greedy, at_least: int) -> None:
    """`got` is `want`'s tokens up to its first near-tie, all of them when there is none."""
    k = _compared(want, at_least)
    assert list(got[:k]) == list(want.tokens[:k]), (list(got), want)
    if want.all_decided:
        assert list(got) == list(want.tokens)


def assert_same_text(got: str, want: Greedy, at_least: int) -> None:
    """`got` (a completion's text) is `want`'s text up to its first near-tie, all of it when there is none."""
    assert got.encode().startswith(decided_text(want, at_least)), (got, want)
    if want.all_decided:
        assert got.encode() == b"".join(want.pieces)
