"""What `hypura-cli` drives: the model (through `hypura.Llama`), llama.cpp's sampler chain, tokens
and chat templates, built exactly as llama-completion builds them (common/common.cpp,
common/sampling.cpp, common/chat.cpp) so that the same flags give the same tokens.

The model and context come from `hypura.Llama`, so Hypura's placement hooks are in charge of every
tensor; generation then calls llama.cpp's C API directly (decode, sampler chain), as the C tool does.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

import numpy as np

from hypura.cli.llama_cli_settings import KV_CACHE_TYPES, SamplingSettings, Settings, sampler_type
from hypura.errors import HypuraError
from hypura.llama import Llama
from hypura.plan.auto import Fit

import llama_cpp  # after hypura.llama: it must load our library

_LOAD_MODES = {
    "auto": llama_cpp.LLAMA_LOAD_MODE_AUTO, "none": llama_cpp.LLAMA_LOAD_MODE_NONE,
    "mmap": llama_cpp.LLAMA_LOAD_MODE_MMAP, "mlock": llama_cpp.LLAMA_LOAD_MODE_MLOCK,
    "mmap+mlock": llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK, "dio": llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO,
}
_ROPE_SCALING = {None: llama_cpp.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED, "none": llama_cpp.LLAMA_ROPE_SCALING_TYPE_NONE,
                 "linear": llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR, "yarn": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN}
_NUMA = {None: False, "distribute": llama_cpp.GGML_NUMA_STRATEGY_DISTRIBUTE,
         "isolate": llama_cpp.GGML_NUMA_STRATEGY_ISOLATE, "numactl": llama_cpp.GGML_NUMA_STRATEGY_NUMACTL}
_FLASH_ATTN = {None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO, True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


def load_model(s: Settings, model_path: str, say=None) -> Llama:
    """say: where the default path's one line goes (the console: Python's stderr is quiet while loading)."""
    n_threads = s.n_threads if s.n_threads > 0 else None  # Llama's default: physical cores (fewer if paging)
    n_threads_batch = s.n_threads_batch if s.n_threads_batch > 0 else n_threads
    model_overrides = {"n_gpu_layers": s.n_gpu_layers, "load_mode": _LOAD_MODES[s.load_mode],
                       "use_extra_bufts": s.repack, "no_host": s.no_host, "check_tensors": s.check_tensors}
    context_overrides = {
        "n_ctx": s.n_ctx, "n_batch": s.n_batch, "n_ubatch": s.n_ubatch, "n_seq_max": 1,
        "flash_attn_type": _FLASH_ATTN[s.flash_attn],
        "type_k": KV_CACHE_TYPES[s.cache_type_k], "type_v": KV_CACHE_TYPES[s.cache_type_v],
        "rope_scaling_type": _ROPE_SCALING[s.rope_scaling],
        "rope_freq_base": s.rope_freq_base, "rope_freq_scale": s.rope_freq_scale,
        "yarn_ext_factor": s.yarn_ext_factor, "yarn_attn_factor": s.yarn_attn_factor,
        "yarn_beta_fast": s.yarn_beta_fast, "yarn_beta_slow": s.yarn_beta_slow, "yarn_orig_ctx": s.yarn_orig_ctx,
        "offload_kqv": s.kv_offload, "op_offload": s.op_offload, "no_perf": not s.perf,
        "swa_full": s.swa_full, "kv_unified": False, "embeddings": False,
    }
    with _quiet_python_stderr():  # llama_cpp.Llama prints its metadata dump; llama.cpp logs still flow
        return Llama(
            model_path,
            param_overrides={"model_params": model_overrides, "context_params": context_overrides},
            n_ctx=s.n_ctx, n_batch=s.n_batch, n_ubatch=s.n_ubatch, n_threads=n_threads,
            n_threads_batch=n_threads_batch, seed=s.sampling.seed,
            override_tensor=list(s.override_tensor) or None,
            kv_overrides=dict(s.kv_overrides) or None, numa=_NUMA[s.numa],
            gpu_mem=s.gpu_mem, ram=s.ram, plan=str(s.plan) if s.plan else None,
            expert_cache=s.expert_slots, verbose=True, fit=_fit(s, say),
        )


def _fit(s: Settings, say) -> Fit:
    """llama.cpp's --fit rules: any placement flag the user set turns it off."""
    return Fit(enabled=s.fit and not s.placement_set, gpu_margin=s.fit_target_mib << 20, min_ctx=s.fit_ctx, say=say)


class _quiet_python_stderr:
    def __enter__(self):
        self.saved, self.null = sys.stderr, open(os.devnull, "w")
        sys.stderr = self.null

    def __exit__(self, *exc):
        sys.stderr = self.saved
        self.null.close()  # the file this opened: sys.stderr may have been swapped meanwhile (pytest's capture)


# --- tokens -------------------------------------------------------------------------------------

class Vocab:
    """common_tokenize / common_token_to_piece over the model's vocabulary."""

    def __init__(self, model):
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_tokens = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self._buf = ctypes.create_string_buffer(256)

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        n_max = len(text) + 2 * int(add_special)
        tokens = (llama_cpp.llama_token * max(n_max, 1))()
        n = llama_cpp.llama_tokenize(self.vocab, text, len(text), tokens, n_max, add_special, parse_special)
        if n < 0:
            tokens = (llama_cpp.llama_token * -n)()
            n = llama_cpp.llama_tokenize(self.vocab, text, len(text), tokens, -n, add_special, parse_special)
        return list(tokens[:n])

    def piece(self, token: int, special: bool = True) -> bytes:
        n = llama_cpp.llama_token_to_piece(self.vocab, token, self._buf, len(self._buf), 0, special)
        if n < 0:
            self._buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, self._buf, len(self._buf), 0, special)
        return self._buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return 0 <= token < self.n_tokens and llama_cpp.llama_vocab_is_eog(self.vocab, token)

    @property
    def bos(self) -> int:
        return llama_cpp.llama_vocab_bos(self.vocab)

    @property
    def add_bos(self) -> bool:
        return llama_cpp.llama_vocab_get_add_bos(self.vocab)

    def eot_or_eos(self) -> int:
        eot = llama_cpp.llama_vocab_eot(self.vocab)
        return llama_cpp.llama_vocab_eos(self.vocab) if eot == llama_cpp.LLAMA_TOKEN_NULL else eot


# --- sampling -----------------------------------------------------------------------------------

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

    def sample(self, ctx, idx: int = -1) -> int:
        """common_sampler_sample: the chain applied to the logits of the batch's output `idx`."""
        llama_cpp.llama_synchronize(ctx)
        logits = llama_cpp.llama_get_logits_ith(ctx, idx)
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
        self.remember(token)

    def remember(self, token: int) -> None:
        """Into the history only: a verification pass accepted it into the chain already."""
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


# --- chat templates -----------------------------------------------------------------------------

# common/chat.cpp's fallback when the model has none (a jinja source llama.cpp detects as chatml)
CHATML_TEMPLATE_SRC = (
    b"{%- for message in messages -%}\n"
    b"  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    b"{%- endfor -%}\n"
    b"{%- if add_generation_prompt -%}\n"
    b"  {{- '<|im_start|>assistant\n' -}}\n"
    b"{%- endif -%}"
)


class ChatTemplate:
    """common_chat_templates with use_jinja = false (llama-completion's default): messages are
    formatted by libllama's built-in templates (llama_chat_apply_template), chosen from the
    model's template source the way llama.cpp chooses them."""

    def __init__(self, model, override: Optional[bytes]):
        self.has_explicit_template = bool(override)
        src = override or b""
        if not override:
            default = llama_cpp.llama_model_chat_template(model, None)
            tool_use = llama_cpp.llama_model_chat_template(model, b"tool_use")
            if default:
                src, self.has_explicit_template = default, True
            if tool_use:
                self.has_explicit_template = True
            if not src or src == b"chatml":
                src = tool_use or CHATML_TEMPLATE_SRC
        elif src == b"chatml":
            src = CHATML_TEMPLATE_SRC
        self.source = src
        if override:  # common_chat_verify_template, as llama.cpp checks --chat-template at parse time
            try:
                self.apply([(b"user", b"test")], True)
            except HypuraError:
                raise HypuraError(
                    f"the supplied chat template is not supported: {override.decode('utf-8', 'replace')!r} "
                    "(without --jinja, only commonly used templates are supported)"
                ) from None

    def apply(self, messages: list[tuple[bytes, bytes]], add_generation_prompt: bool) -> bytes:
        chat = (llama_cpp.llama_chat_message * max(len(messages), 1))(
            *[llama_cpp.llama_chat_message(role, content) for role, content in messages]
        )
        size = sum(len(r) + len(c) for r, c in messages)
        buf = ctypes.create_string_buffer(max(size + size // 4, 1))
        n = llama_cpp.llama_chat_apply_template(self.source, chat, len(messages), add_generation_prompt, buf, len(buf))
        if n < 0:
            raise HypuraError("this custom template is not supported, try using --jinja")
        if n > len(buf):
            buf = ctypes.create_string_buffer(n)
            n = llama_cpp.llama_chat_apply_template(self.source, chat, len(messages), add_generation_prompt, buf, len(buf))
        return buf.raw[:n]

    def format_single(self, past: list[tuple[bytes, bytes]], new: tuple[bytes, bytes], add_ass: bool) -> bytes:
        """common_chat_format_single: the text `new` adds after `past`."""
        fmt_past = self.apply(past, False) if past else b""
        prefix = b"\n" if add_ass and fmt_past.endswith(b"\n") else b""
        fmt_new = self.apply(past + [new], add_ass)
        return prefix + fmt_new[len(fmt_past):]

    def example(self) -> bytes:
        return self.apply([(b"system", b"You are a helpful assistant"), (b"user", b"Hello"),
                           (b"assistant", b"Hi there"), (b"user", b"How are you?")], False)
