"""Greedy generation with or without speculation, for benchmarks and tests: the prompt prefilled,
then one token per llama_decode (plain) or one verification pass per step (speculative)."""

from __future__ import annotations

import time
from dataclasses import dataclass

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


def _top(kv, i: int) -> tuple[int, float]:
    """The greedy token at output i and its logit's lead over the runner-up."""
    row = kv.logits(i)
    second, first = np.partition(row, -2)[-2:]
    return int(np.argmax(row)), float(first - second)


def greedy(llm, prompt: list[int], n_predict: int, verifier=None) -> Run:
    """n_predict greedy tokens after `prompt` from an empty KV cache (fewer at an end-of-generation token).
    llm: a hypura.loaded.LoadedModel; verifier: a hypura.speculative Verifier or TreeVerifier on its context."""
    kv = llm.context
    kv.clear()
    n_batch = kv.n_batch
    t0 = time.perf_counter()
    for i in range(0, len(prompt), n_batch):
        if not kv.decode_tokens(prompt[i: i + n_batch]):
            raise RuntimeError("llama_decode failed on the prompt")
    token, gap = _top(kv, -1)
    out, gaps = [token], [gap]
    t1 = time.perf_counter()
    history, n_past = list(prompt), len(prompt)
    while len(out) < n_predict and not llm.vocab.is_eog(out[-1]):
        if verifier is None:
            if not kv.decode_tokens([out[-1]]):
                raise RuntimeError("llama_decode failed")
            history.append(out[-1])
            n_past += 1
            token, gap = _top(kv, -1)
            out.append(token)
            gaps.append(gap)
            continue
        step = verifier.step(history + [out[-1]], n_past, lambda i: int(np.argmax(kv.logits(i))), n_predict - len(out))
        if step is None:
            raise RuntimeError("llama_decode failed on a verification pass")
        history += [out[-1]] + step[:-1]
        n_past += len(step)
        out += step
    return Run(out[:n_predict], t1 - t0, time.perf_counter() - t1, tuple(gaps[:n_predict]) if verifier is None else ())
