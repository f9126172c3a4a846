"""A request's llama.cpp sampler chain, in common/sampling.cpp's default order:

    [grammar] -> penalties -> top_k -> top_p -> min_p -> temperature -> dist(seed)      (temperature > 0)
    [grammar] -> penalties -> greedy                                                    (temperature <= 0)

Stages at their neutral value are left out. A grammar comes first: it sets every token it does not
allow to -inf, so no later stage can pick one (and llama_sampler_accept advances it). The penalties see the prompt (accepted before the first
sample, as llama-server does) and every sampled token; `llama_sampler_sample` accepts what it returns.
Used only on the engine thread; each chain is freed when its request ends.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from hypura.engine.types import SamplingParams, TokenLogprob
from hypura.errors import HypuraError

MIN_KEEP = 1  # candidates top_p/min_p always keep: llama-cpp-python's value (llama.cpp keeps one at 0 too)


def _penalties_on(p: SamplingParams) -> bool:
    neutral = p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
    return not neutral and p.repeat_last_n != 0


def grammar_sampler(vocab, grammar: str):
    """llama.cpp's grammar sampler for GBNF `grammar` (start rule `root`); HypuraError when it does not parse
    (llama.cpp logs the reason) or has left recursion. The caller frees it, or a chain owns it."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        raise HypuraError("the grammar does not parse as GBNF with a 'root' rule (or it is left-recursive)")
    return sampler


def check_grammar(vocab, grammar: str) -> None:
    llama_cpp.llama_sampler_free(grammar_sampler(vocab, grammar))


class Sampler:
    def __init__(self, params: SamplingParams, n_vocab: int, n_ctx_per_seq: int, vocab=None):
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self.penalized = _penalties_on(params)
        # argmax alone: the engine may pick the token from the step's logits matrix itself (greedy_rows);
        # never with a grammar, which must mask the logits first
        self.greedy = params.temperature <= 0 and not self.penalized and params.grammar is None
        add = lambda s: llama_cpp.llama_sampler_chain_add(self._chain, s)  # noqa: E731  (the chain owns it)
        if params.grammar is not None:
            add(grammar_sampler(vocab, params.grammar))
        self._penalties = None
        if self.penalized:
            last_n = n_ctx_per_seq if params.repeat_last_n == -1 else params.repeat_last_n  # -1: the whole context
            self._penalties = llama_cpp.llama_sampler_init_penalties(
                n_vocab, last_n, params.repeat_penalty, params.frequency_penalty, params.presence_penalty)
            add(self._penalties)
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
        """The penalties' history starts with the prompt (theirs only: a grammar must not see the prompt)."""
        if self._penalties is not None:
            for t in tokens:
                llama_cpp.llama_sampler_accept(self._penalties, t)

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


def token_logprob(ctx, batch_index: int, token: int, top_n: int) -> TokenLogprob:
    """`token`'s log-probability in the raw logits of batch position `batch_index`, and the `top_n` best
    (what OpenAI's logprobs report: the model's distribution, before temperature and the other stages)."""
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llama_cpp.llama_get_model(ctx)))
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, batch_index), shape=(n_vocab,))
    peak = float(logits.max())
    log_z = peak + float(np.log(np.exp(logits - peak).sum()))
    top = []
    if top_n:
        best = np.argpartition(-logits, top_n)[:top_n]
        best = best[np.argsort(-logits[best])]
        top = [(int(t), float(logits[t]) - log_z) for t in best]
    return TokenLogprob(float(logits[token]) - log_z, tuple(top))
