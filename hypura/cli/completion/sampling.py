"""common/sampling.cpp for `hypura-cli`: the sampler settings with the model's `general.sampling.*`
defaults, and common_sampler (llama.cpp's chain plus the history of accepted tokens)."""

from __future__ import annotations

import ctypes
from typing import Optional

from hypura.bindings.vocab import Vocab
from hypura.cli.completion.common_params import SamplingSettings, sampler_type
from hypura.engine.sampler import Sampler
from hypura.engine.types import SamplingParams

import llama_cpp  # noqa: E402  (after hypura.llama: our library)


_META_SAMPLING = (  # (llama_model_meta_key, field, type): common_init_sampler_from_model
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_TOP_K, "top_k", int),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_TOP_P, "top_p", float),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_MIN_P, "min_p", float),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_XTC_PROBABILITY, "xtc_probability", float),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_XTC_THRESHOLD, "xtc_threshold", float),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_TEMP, "temp", float),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_PENALTY_LAST_N, "penalty_last_n", int),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_PENALTY_REPEAT, "penalty_repeat", float),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT, "mirostat", int),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT_TAU, "mirostat_tau", float),
    (llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT_ETA, "mirostat_eta", float),
)


def _meta_str(model, key: bytes) -> Optional[str]:
    buf = ctypes.create_string_buffer(512)
    if llama_cpp.llama_model_meta_val_str(model, key, buf, len(buf)) > 0:
        return buf.value.decode("utf-8", "replace")
    return None


def sampling_from_model(model, sp: SamplingSettings) -> dict:
    """The sampler settings, with the model's `general.sampling.*` defaults for those not set."""
    values = {f: getattr(sp, f) for f in sp.__dataclass_fields__}
    if "samplers" not in sp.user_set:
        seq = _meta_str(model, llama_cpp.llama_model_meta_key_str(llama_cpp.LLAMA_MODEL_META_KEY_SAMPLING_SEQUENCE))
        if seq:
            names = [t for t in map(sampler_type, seq.split(";")) if t]
            if names:
                values["samplers"] = tuple(names)
    for key_id, name, kind in _META_SAMPLING:
        if name in sp.user_set:
            continue
        text = _meta_str(model, llama_cpp.llama_model_meta_key_str(key_id))
        if text is not None:
            try:
                values[name] = kind(float(text)) if kind is int else kind(text)
            except ValueError:
                pass
    return values


# common_params_sampling's names -> SamplingParams' (the rest are spelled alike)
_PARAMS = {"temp": "temperature", "typ_p": "typical_p", "penalty_last_n": "repeat_last_n",
           "penalty_repeat": "repeat_penalty", "penalty_freq": "frequency_penalty",
           "penalty_present": "presence_penalty"}
_CLI_ONLY = ("ignore_eos", "no_perf", "user_set", "logit_bias")


def sampling_params(sp: dict, vocab: Vocab) -> SamplingParams:
    """common_sampler_init's settings as the one SamplingParams: --ignore-eos and the model's suppressed tokens
    as logit biases of -inf after the user's."""
    bias = [tuple(b) for b in sp["logit_bias"]]
    if sp["ignore_eos"]:
        bias += [(t, float("-inf")) for t in range(vocab.n_tokens) if vocab.is_eog(t)]
    bias += [(t, float("-inf")) for t in vocab.suppressed()]
    fields = {_PARAMS.get(k, k): v for k, v in sp.items() if k not in _CLI_ONLY}
    return SamplingParams(**fields, logit_bias=tuple(bias), perf=not sp["no_perf"])


class CommonSampler:
    """common_sampler: the sampler chain (hypura.engine.Sampler, built from SamplingParams) plus the history of
    accepted tokens."""

    def __init__(self, vocab: Vocab, sp: dict, n_ctx: int):
        self.params = sp  # common_params_sampling's names, as llama-completion prints them
        self.vocab = vocab
        self._sampler = Sampler(sampling_params(sp, vocab), vocab.n_tokens, n_ctx, vocab.vocab)
        self.chain = self._sampler.chain
        self.prev: list[int] = []  # common_sampler's ring buffer of n_prev = 64 tokens

    def sample(self, ctx, idx: int = -1) -> int:
        """common_sampler_sample: the chain applied to the logits of the batch's output `idx`."""
        return self._sampler.apply(ctx, idx)

    def accept(self, token: int) -> None:
        self._sampler.accept(token)
        self.remember(token)

    def remember(self, token: int) -> None:
        """Into the history only: a verification pass accepted it into the chain already."""
        self.prev = (self.prev + [token])[-64:]

    def reset(self) -> None:
        self.prev = []
        self._sampler.reset()

    def last(self) -> int:
        return self.prev[-1] if self.prev else llama_cpp.LLAMA_TOKEN_NULL

    def prev_str(self, n: int) -> bytes:
        """common_sampler_prev_str: the last n accepted tokens as text (special tokens rendered)."""
        return b"".join(self.vocab.piece(t) for t in self.prev[-n:])

    def seed(self) -> int:
        return llama_cpp.llama_sampler_get_seed(self.chain)

    def close(self) -> None:
        self._sampler.close()
