"""common/sampling.cpp for `hypura-cli`: the sampler settings with the model's `general.sampling.*`
defaults, and common_sampler (llama.cpp's chain plus the history of accepted tokens)."""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

from hypura.cli.completion.common_init import Vocab
from hypura.cli.completion.common_params import SamplingSettings, sampler_type
from hypura.errors import HypuraError

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


class Sampler:
    """common_sampler: the llama.cpp sampler chain plus the history of accepted tokens."""

    def __init__(self, model, vocab: Vocab, sp: dict):
        self.params = sp
        self.vocab = vocab
        lparams = llama_cpp.llama_sampler_chain_default_params()
        lparams.no_perf = sp["no_perf"]
        self.chain = llama_cpp.llama_sampler_chain_init(lparams)
        for smpl in self._samplers(model, vocab, sp):
            llama_cpp.llama_sampler_chain_add(self.chain, smpl)
        self.prev: list[int] = []  # common_sampler's ring buffer of n_prev = 64 tokens
        self._cur = np.zeros(vocab.n_tokens, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        self._cur["id"] = np.arange(vocab.n_tokens, dtype=np.int32)
        self._cur_p = llama_cpp.llama_token_data_array(
            data=self._cur.ctypes.data_as(llama_cpp.llama_token_data_p), size=vocab.n_tokens, selected=-1, sorted=False
        )

    @staticmethod
    def _samplers(model, vocab: Vocab, sp: dict) -> list:
        n_vocab, seed = vocab.n_tokens, sp["seed"]
        if not (np.isfinite(sp["penalty_repeat"]) and sp["penalty_repeat"] > 0):
            raise HypuraError("penalty_repeat must be finite and greater than 0")
        samplers = []
        bias = [tuple(b) for b in sp["logit_bias"]]  # user biases, --ignore-eos, the model's suppressed tokens
        if sp["ignore_eos"]:
            bias += [(t, float("-inf")) for t in range(n_vocab) if vocab.is_eog(t)]
        n_suppress = ctypes.c_int32(0)
        suppress = llama_cpp.llama_vocab_get_suppress_tokens(vocab.vocab, ctypes.byref(n_suppress))
        bias += [(suppress[i], float("-inf")) for i in range(n_suppress.value)]
        if bias:
            arr = (llama_cpp.llama_logit_bias * len(bias))(*[llama_cpp.llama_logit_bias(t, b) for t, b in bias])
            samplers.append(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
        if sp["mirostat"] == 1:
            return samplers + [llama_cpp.llama_sampler_init_temp(sp["temp"]), llama_cpp.llama_sampler_init_mirostat(
                n_vocab, seed, sp["mirostat_tau"], sp["mirostat_eta"], 100)]
        if sp["mirostat"] == 2:
            return samplers + [llama_cpp.llama_sampler_init_temp(sp["temp"]), llama_cpp.llama_sampler_init_mirostat_v2(
                seed, sp["mirostat_tau"], sp["mirostat_eta"])]
        if sp["mirostat"] != 0:
            raise HypuraError(f"unknown mirostat version {sp['mirostat']}")
        breakers = (ctypes.c_char_p * len(sp["dry_sequence_breakers"]))(*sp["dry_sequence_breakers"])
        init = {
            "dry": lambda: llama_cpp.llama_sampler_init_dry(
                vocab.vocab, sp["dry_multiplier"], sp["dry_base"], sp["dry_allowed_length"],
                sp["dry_penalty_last_n"], breakers, len(breakers)),
            "top_k": lambda: llama_cpp.llama_sampler_init_top_k(sp["top_k"]),
            "top_p": lambda: llama_cpp.llama_sampler_init_top_p(sp["top_p"], 0),
            "top_n_sigma": lambda: llama_cpp.llama_sampler_init_top_n_sigma(sp["top_n_sigma"]),
            "min_p": lambda: llama_cpp.llama_sampler_init_min_p(sp["min_p"], 0),
            "xtc": lambda: llama_cpp.llama_sampler_init_xtc(sp["xtc_probability"], sp["xtc_threshold"], 0, seed),
            "typ_p": lambda: llama_cpp.llama_sampler_init_typical(sp["typ_p"], 0),
            "temperature": lambda: llama_cpp.llama_sampler_init_temp_ext(
                sp["temp"], sp["dynatemp_range"], sp["dynatemp_exponent"]),
            "infill": lambda: llama_cpp.llama_sampler_init_infill(vocab.vocab),
            "penalties": lambda: llama_cpp.llama_sampler_init_penalties(
                n_vocab, sp["penalty_last_n"], sp["penalty_repeat"], sp["penalty_freq"], sp["penalty_present"]),
        }
        samplers += [init[name]() for name in sp["samplers"] if name in init]
        if "adaptive_p" in sp["samplers"]:  # it selects the token itself, so it comes last instead of dist
            samplers.append(llama_cpp.llama_sampler_init_adaptive_p(sp["adaptive_target"], sp["adaptive_decay"], seed))
        else:
            samplers.append(llama_cpp.llama_sampler_init_dist(seed))
        return samplers

    def sample(self, ctx) -> int:
        """common_sampler_sample(idx = -1): the chain applied to the last logits."""
        llama_cpp.llama_synchronize(ctx)
        logits = llama_cpp.llama_get_logits_ith(ctx, -1)
        self._cur["logit"] = np.ctypeslib.as_array(logits, shape=(self.vocab.n_tokens,))
        self._cur["id"] = np.arange(self.vocab.n_tokens, dtype=np.int32)
        self._cur["p"] = 0.0
        cur_p = self._cur_p
        cur_p.data = self._cur.ctypes.data_as(llama_cpp.llama_token_data_p)
        cur_p.size, cur_p.selected, cur_p.sorted = self.vocab.n_tokens, -1, False
        llama_cpp.llama_sampler_apply(self.chain, ctypes.byref(cur_p))
        if cur_p.selected < 0:
            raise HypuraError("no selected token during sampling - check your sampling configuration")
        return int(cur_p.data[cur_p.selected].id)

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.chain, token)
        self.prev = (self.prev + [token])[-64:]

    def reset(self) -> None:
        self.prev = []
        llama_cpp.llama_sampler_reset(self.chain)

    def last(self) -> int:
        return self.prev[-1] if self.prev else llama_cpp.LLAMA_TOKEN_NULL

    def prev_str(self, n: int) -> bytes:
        """common_sampler_prev_str: the last n accepted tokens as text (special tokens rendered)."""
        return b"".join(self.vocab.piece(t) for t in self.prev[-n:])

    def seed(self) -> int:
        return llama_cpp.llama_sampler_get_seed(self.chain)

    def close(self) -> None:
        if self.chain is not None:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None
