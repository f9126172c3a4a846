"""Greedy generation with or without speculation, for benchmarks and tests: the prompt prefilled,
then one token per llama_decode (plain) or one verification pass per step (speculative)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import llama_cpp
import numpy as np


@dataclass(frozen=True)
class Run:
    tokens: list[int]
    prefill_s: float
    decode_s: float  # after the first token: decoding and drafting
    gaps: tuple = ()  # plain runs: at each token, its logit less the runner-up's (a near-tie: kernels decide)

    @property
    def tok_s(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 else 0.0


def _logits(llm, i: int) -> np.ndarray:
    n_vocab = llama_cpp.llama_vocab_n_tokens(llm._model.vocab)
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, i), shape=(n_vocab,))


def _argmax(llm, i: int) -> int:
    return int(np.argmax(_logits(llm, i)))


def _top(llm, i: int) -> tuple[int, float]:
    """The greedy token at output i and its logit's lead over the runner-up."""
    row = _logits(llm, i)
    second, first = np.partition(row, -2)[-2:]
    return int(np.argmax(row)), float(first - second)


def greedy(llm, prompt: list[int], n_predict: int, verifier=None) -> Run:
    """n_predict greedy tokens after `prompt` from an empty KV cache (fewer at an end-of-generation token)."""
    llm.clear_memory()
    n_batch = llama_cpp.llama_n_batch(llm.ctx)
    t0 = time.perf_counter()
    for i in range(0, len(prompt), n_batch):
        if not llm.decode_tokens(prompt[i: i + n_batch]):
            raise RuntimeError("llama_decode failed on the prompt")
    token, gap = _top(llm, -1)
    out, gaps = [token], [gap]
    t1 = time.perf_counter()
    history, n_past = list(prompt), len(prompt)
    vocab = llm._model.vocab
    while len(out) < n_predict and not llama_cpp.llama_vocab_is_eog(vocab, out[-1]):
        if verifier is None:
            if not llm.decode_tokens([out[-1]]):
                raise RuntimeError("llama_decode failed")
            history.append(out[-1])
            n_past += 1
            token, gap = _top(llm, -1)
            out.append(token)
            gaps.append(gap)
            continue
        step = verifier.step(history + [out[-1]], n_past, lambda i: _argmax(llm, i), n_predict - len(out))
        if step is None:
            raise RuntimeError("llama_decode failed on a verification pass")
        history += [out[-1]] + step[:-1]
        n_past += len(step)
        out += step
    return Run(out[:n_predict], t1 - t0, time.perf_counter() - t1, tuple(gaps[:n_predict]) if verifier is None else ())
