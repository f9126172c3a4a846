"""A request's llama.cpp sampler chain, in common/sampling.cpp's default order:

    [grammar] -> penalties -> top_k -> top_p -> min_p -> temperature -> dist(seed)      (temperature > 0)
    [grammar] -> penalties -> greedy                                                    (temperature <= 0)

Stages at their neutral value are left out. A grammar comes first: it sets every token it does not
allow to -inf, so no later stage can pick one (and llama_sampler_accept advances it). The penalties see the prompt (accepted before the first
sample, as llama-server does) and every sampled token; `llama_sampler_sample` accepts what it returns.
Used only on the engine thread; each chain is freed when its request ends.

With `SamplingParams.samplers` given, the chain is common/sampling.cpp's common_sampler exactly (hypura-cli's):
logit biases, then mirostat, or the named stages in order and dist (adaptive-p last instead of dist).
"""

from __future__ import annotations

import ctypes
import math

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
        """vocab: the model's llama_vocab, for the grammar, dry and infill stages."""
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = not params.perf
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        self.n_vocab, self._cur = n_vocab, None
        self.penalized = _penalties_on(params)
        # argmax alone: the engine may pick the token from the step's logits matrix itself (greedy_rows);
        # never with a grammar, which must mask the logits first
        self.greedy = params.temperature <= 0 and not self.penalized and params.samplers is None \
            and not params.logit_bias and not params.mirostat and params.grammar is None
        add = lambda s: llama_cpp.llama_sampler_chain_add(self._chain, s)  # noqa: E731  (the chain owns it)
        if params.grammar is not None:
            add(grammar_sampler(vocab, params.grammar))
        self._penalties = None
        if params.logit_bias:
            bias = (llama_cpp.llama_logit_bias * len(params.logit_bias))(
                *[llama_cpp.llama_logit_bias(t, b) for t, b in params.logit_bias])
            add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), bias))
        if params.mirostat or params.samplers is not None:
            for stage in _common_stages(params, n_vocab, n_ctx_per_seq, vocab):
                add(stage)
            return
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

    def apply(self, ctx, batch_index: int = -1) -> int:
        """common_sampler_sample: the chain applied to a position's logits, the token not accepted (accept()
        it); a chain that selects nothing raises, as llama.cpp's tools do."""
        if self._cur is None:
            self._cur = np.zeros(self.n_vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        llama_cpp.llama_synchronize(ctx)
        logits = llama_cpp.llama_get_logits_ith(ctx, batch_index)
        cur = self._cur
        cur["logit"] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
        cur["id"] = np.arange(self.n_vocab, dtype=np.int32)
        cur["p"] = 0.0
        cur_p = llama_cpp.llama_token_data_array(data=cur.ctypes.data_as(llama_cpp.llama_token_data_p),
                                                 size=self.n_vocab, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(cur_p))
        if cur_p.selected < 0:
            raise HypuraError("no selected token during sampling - check your sampling configuration")
        return int(cur_p.data[cur_p.selected].id)

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._chain, token)

    def reset(self) -> None:
        llama_cpp.llama_sampler_reset(self._chain)

    @property
    def chain(self):
        """The llama_sampler chain (its stages' names, seed and perf counters)."""
        return self._chain

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


def _common_stages(p: SamplingParams, n_vocab: int, n_ctx_per_seq: int, vocab) -> list:
    """common_sampler_init's stages after the logit biases: mirostat, or p.samplers in order, then dist."""
    seed = llama_cpp.LLAMA_DEFAULT_SEED if p.seed is None else p.seed
    if p.mirostat not in (0, 1, 2):
        raise HypuraError(f"unknown mirostat version {p.mirostat}")
    if p.mirostat == 1:
        return [llama_cpp.llama_sampler_init_temp(p.temperature),
                llama_cpp.llama_sampler_init_mirostat(n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100)]
    if p.mirostat == 2:
        return [llama_cpp.llama_sampler_init_temp(p.temperature),
                llama_cpp.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta)]
    last_n = lambda n: n_ctx_per_seq if n == -1 else n  # noqa: E731  (-1: the whole context)
    breakers = (ctypes.c_char_p * len(p.dry_sequence_breakers))(*p.dry_sequence_breakers)
    init = {
        "dry": lambda: llama_cpp.llama_sampler_init_dry(vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                                                         last_n(p.dry_penalty_last_n), breakers, len(breakers)),
        "top_k": lambda: llama_cpp.llama_sampler_init_top_k(p.top_k),
        "top_p": lambda: llama_cpp.llama_sampler_init_top_p(p.top_p, 0),
        "top_n_sigma": lambda: llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma),
        "min_p": lambda: llama_cpp.llama_sampler_init_min_p(p.min_p, 0),
        "xtc": lambda: llama_cpp.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 0, seed),
        "typ_p": lambda: llama_cpp.llama_sampler_init_typical(p.typical_p, 0),
        "temperature": lambda: llama_cpp.llama_sampler_init_temp_ext(p.temperature, p.dynatemp_range,
                                                                     p.dynatemp_exponent),
        "infill": lambda: llama_cpp.llama_sampler_init_infill(vocab),
        "penalties": lambda: llama_cpp.llama_sampler_init_penalties(
            n_vocab, last_n(p.repeat_last_n), p.repeat_penalty, p.frequency_penalty, p.presence_penalty),
    }
    stages = [init[name]() for name in p.samplers or () if name in init]
    if "adaptive_p" in (p.samplers or ()):  # it selects the token itself, so it comes last instead of dist
        return stages + [llama_cpp.llama_sampler_init_adaptive_p(p.adaptive_target, p.adaptive_decay, seed)]
    return stages + [llama_cpp.llama_sampler_init_dist(seed)]


def greedy_rows(ctx, n_vocab: int, n_outputs: int, rows: list[int]) -> list[int]:
    """The greedy token of each of the last decode's output rows `rows` (ascending, of `n_outputs`; row k
    is the k-th token of the batch with its logits flag set, llama_get_logits' order): one numpy argmax
    over the logits matrix, where a llama_sampler_sample per row would copy the vocabulary into its
    candidates and scan them. The same pick as llama.cpp's greedy sampler: numpy's argmax returns the
    first maximum, as its `>` scan does. A row whose maximum is NaN (numpy picks the first NaN, llama.cpp
    none past index 0) comes back as -1: the caller samples it with llama.cpp."""
    m = _logits_view(ctx, n_outputs, n_vocab)
    if len(rows) != n_outputs:
        m = m[rows]
    out = m.argmax(axis=1).tolist()
    for k, token in enumerate(out):  # a scalar check a row: a step's rows are few, and fancy indexing costs more
        if math.isnan(m[k, token]):
            out[k] = -1
    return out


_view: tuple = (None, None)  # ((address, rows, n_vocab), the array over llama.cpp's logits buffer there)


def _logits_view(ctx, n_outputs: int, n_vocab: int) -> np.ndarray:
    """The last decode's logits matrix, a view kept while llama.cpp's buffer stays where it is (it moves only
    when it grows): numpy's as_array costs ~70 us a step once a decode has swept the caches (engine thread)."""
    global _view
    key = (ctypes.cast(llama_cpp.llama_get_logits(ctx), ctypes.c_void_p).value, n_outputs, n_vocab)
    view = _view  # one read: engines of other models replace it from their threads
    if view[0] != key:
        buffer = (ctypes.c_float * (n_outputs * n_vocab)).from_address(key[0])
        view = _view = (key, np.frombuffer(buffer, dtype=np.float32).reshape(n_outputs, n_vocab))
    return view[1]


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
