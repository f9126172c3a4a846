"""A request's llama.cpp sampler chain, in common/sampling.cpp's default order:

    penalties -> top_k -> top_p -> min_p -> temperature -> dist(seed)      (temperature > 0)
    penalties -> greedy                                                    (temperature <= 0)

Stages at their neutral value are left out. The penalties see the prompt (accepted before the first
sample, as llama-server does) and every sampled token; `llama_sampler_sample` accepts what it returns.
Used only on the engine thread; each chain is freed when its request ends.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from hypura.engine.types import SamplingParams

MIN_KEEP = 1  # candidates top_p/min_p always keep: llama-cpp-python's value (llama.cpp keeps one at 0 too)


def _penalties_on(p: SamplingParams) -> bool:
    neutral = p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
    return not neutral and p.repeat_last_n != 0


class Sampler:
    def __init__(self, params: SamplingParams, n_vocab: int, n_ctx_per_seq: int):
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self.penalized = _penalties_on(params)
        # argmax alone: the engine may pick the token from the step's logits matrix itself (greedy_rows)
        self.greedy = params.temperature <= 0 and not self.penalized
        add = lambda s: llama_cpp.llama_sampler_chain_add(self._chain, s)  # noqa: E731  (the chain owns it)
        if self.penalized:
            last_n = n_ctx_per_seq if params.repeat_last_n == -1 else params.repeat_last_n  # -1: the whole context
            add(llama_cpp.llama_sampler_init_penalties(n_vocab, last_n, params.repeat_penalty,
                                                       params.frequency_penalty, params.presence_penalty))
        if params.temperature <= 0:
            add(llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, MIN_KEEP))
        if params.min_p > 0.0:
            add(llama_cpp.llama_sampler_init_min_p(params.min_p, MIN_KEEP))
        add(llama_cpp.llama_sampler_init_temp(params.temperature))
        # LLAMA_DEFAULT_SEED asks llama.cpp for a random seed
        add(llama_cpp.llama_sampler_init_dist(llama_cpp.LLAMA_DEFAULT_SEED if params.seed is None else params.seed))

    def accept_prompt(self, tokens: list[int]) -> None:
        """The penalties' history starts with the prompt (a no-op chain otherwise: nothing else keeps one)."""
        if self.penalized:
            for t in tokens:
                llama_cpp.llama_sampler_accept(self._chain, t)

    def sample(self, ctx, batch_index: int) -> int:
        """Sample (and accept) a token from the logits of the last decode's batch position `batch_index`."""
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index))

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


def greedy_rows(ctx, n_vocab: int, n_outputs: int, rows: list[int]) -> list[int]:
    """The greedy token of each of the last decode's output rows `rows` (ascending, of `n_outputs`; row k
    is the k-th token of the batch with its logits flag set, llama_get_logits' order): one numpy argmax
    over the logits matrix, where a llama_sampler_sample per row would copy the vocabulary into its
    candidates and scan them. The same pick as llama.cpp's greedy sampler: numpy's argmax returns the
    first maximum, as its `>` scan does. A row whose maximum is NaN (numpy picks the first NaN, llama.cpp
    none past index 0) comes back as -1: the caller samples it with llama.cpp."""
    m = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(n_outputs, n_vocab))
    if len(rows) != n_outputs:
        m = m[rows]
    picks = m.argmax(axis=1)
    out = picks.tolist()
    nan = np.isnan(m[np.arange(len(rows)), picks])
    if nan.any():
        for k in np.flatnonzero(nan).tolist():
            out[k] = -1
    return out
