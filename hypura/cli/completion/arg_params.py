"""Parsed `hypura-cli` flags (click's strings) -> Settings, with llama.cpp's value rules and messages
(common/arg.cpp): numbers read like std::stoi/stof, files read whole, escapes processed in the
prompt, reverse prompts and --in-prefix/--in-suffix unless --no-escape."""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from hypura.cli.completion.arg_values import (
    is_falsey, is_truthy, on_off_auto, process_escapes, stof, stoi, stoul32, value_error)
from hypura.cli.completion.common_params import (
    FFN_DENSE_REGEX,
    FFN_EXPS_REGEX,
    KV_CACHE_TYPES,
    LOAD_MODES,
    SAMPLER_CHARS,
    SamplingSettings,
    Settings,
    sampler_type,
)
from hypura.cli.completion.device_flags import device_settings
from hypura.cli.completion.speculative import spec_settings


def _b(text: str) -> bytes:
    """argv text back to the bytes the shell passed (llama.cpp works on raw bytes)."""
    return os.fsencode(text)


def _read_file(flag: str, path: str, strip_newline: bool) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError:
        raise value_error(flag, f"error: failed to open file '{path}'") from None
    if strip_newline and data.endswith(b"\n"):
        data = data[:-1]
    return data


def _convert(flag: str, value: str, fn: Callable):
    try:
        return fn(value)
    except ValueError as e:
        raise value_error(flag, str(e)) from None


def _gpu_layers(value: str) -> int:
    return {"auto": -1, "all": -2}.get(value) if value in ("auto", "all") else stoi(value)


def _logit_bias(value: str) -> tuple[int, float]:
    m = re.match(r"\s*([+-]?\d+)\s*([+-])(.*)$", value)
    if not m:
        raise ValueError("invalid input format")
    try:
        bias = stof(m.group(3))
    except ValueError:
        raise ValueError("invalid input format") from None
    return int(m.group(1)), -bias if m.group(2) == "-" else bias


def build_settings(kw: dict) -> Settings:
    if kw.pop("version"):
        from hypura import __version__

        print(f"hypura-cli {__version__} (llama.cpp from llama-cpp-python 0.3.36)", file=sys.stderr)
        raise SystemExit(0)
    s: dict = {}
    sp: dict = {}
    user_set: set[str] = set()

    def num(key: str, flag: str, fn: Callable) -> Optional[object]:
        value = kw.get(key)
        return None if value is None else _convert(flag, value, fn)

    # prompt sources: llama.cpp keeps the last of -p / -f given; click keeps both, -f wins when both
    if kw["model"] is not None:
        s["model"] = Path(kw["model"])
    if kw["prompt"] is not None:
        s["prompt"] = _b(kw["prompt"])
    if kw["file"] is not None:
        s["prompt"] = _read_file("-f", kw["file"], strip_newline=True)
    if kw["system_prompt"] is not None:
        s["system_prompt"] = _b(kw["system_prompt"])
    if kw["system_prompt_file"] is not None:
        s["system_prompt"] = _read_file("-sysf", kw["system_prompt_file"], strip_newline=True)

    for key, field, flag in (("n_predict", "n_predict", "-n"), ("ctx_size", "n_ctx", "-c"), ("batch_size", "n_batch", "-b"),
                             ("ubatch_size", "n_ubatch", "-ub"), ("keep", "n_keep", "--keep"),
                             ("threads", "n_threads", "-t"), ("threads_batch", "n_threads_batch", "-tb"),
                             ("verbosity", "verbosity", "-lv")):
        value = num(key, flag, stoi)
        if value is not None:
            s[field] = value
    for key in ("n_threads", "n_threads_batch"):
        if key in s and s[key] <= 0:
            s[key] = os.cpu_count() or 1  # std::thread::hardware_concurrency()
    if kw["verbose"]:
        s["verbosity"] = 2**31 - 1
    if kw["gpu_layers"] is not None:
        s["n_gpu_layers"] = _convert("-ngl", kw["gpu_layers"], _gpu_layers)
    if kw["override_tensor"]:
        for spec in kw["override_tensor"]:
            if any("=" not in part for part in spec.split(",")):
                raise value_error("-ot", "invalid value")
        s["override_tensor"] = tuple(kw["override_tensor"])
    s["override_tensor"] = s.get("override_tensor", ()) + _cpu_ffn_overrides(kw)
    s["devices"] = device_settings(kw)
    s["placement_set"] = (bool(s["override_tensor"]) or s.get("n_gpu_layers", -1) != -1
                          or kw["expert_slots"] is not None or s["devices"].placement)
    s.update(_fit(kw))
    if kw["no_host"]:
        s["no_host"] = True
    if kw["check_tensors"]:
        s["check_tensors"] = True
    if kw["repack"] is not None:
        s["repack"] = kw["repack"]
    if kw["override_kv"]:
        s["kv_overrides"] = tuple(_convert("--override-kv", item, _kv_override)
                                  for spec in kw["override_kv"] for item in spec.split(","))
    if kw["numa"] is not None:
        if kw["numa"] not in ("distribute", "isolate", "numactl", ""):
            raise value_error("--numa", "invalid value")
        s["numa"] = kw["numa"] or "distribute"
    if kw["rope_scaling"] is not None:
        if kw["rope_scaling"] not in ("none", "linear", "yarn"):
            raise value_error("--rope-scaling", "invalid value")
        s["rope_scaling"] = kw["rope_scaling"]
    for key, flag in (("rope_freq_base", "--rope-freq-base"), ("rope_freq_scale", "--rope-freq-scale"),
                      ("yarn_ext_factor", "--yarn-ext-factor"), ("yarn_attn_factor", "--yarn-attn-factor"),
                      ("yarn_beta_slow", "--yarn-beta-slow"), ("yarn_beta_fast", "--yarn-beta-fast")):
        value = num(key, flag, stof)
        if value is not None:
            s[key] = value
    if kw["rope_scale"] is not None:
        s["rope_freq_scale"] = _div(1.0, _convert("--rope-scale", kw["rope_scale"], stof))
    if kw["yarn_orig_ctx"] is not None:
        s["yarn_orig_ctx"] = _convert("--yarn-orig-ctx", kw["yarn_orig_ctx"], stoi)
    if kw["flash_attn"] is not None:
        s["flash_attn"] = _convert("-fa", kw["flash_attn"], lambda v: on_off_auto("--flash-attn", v))
    if kw["color"] is not None:
        s["color"] = _convert("-co", kw["color"], lambda v: on_off_auto("--color", v))
    for key, flag in (("cache_type_k", "-ctk"), ("cache_type_v", "-ctv")):
        if kw[key] is not None:
            if kw[key] not in KV_CACHE_TYPES:
                raise value_error(flag, f"Unsupported cache type: {kw[key]}")
            s[key] = kw[key]
    s["load_mode"] = _load_mode(kw)
    for key in ("swa_full", "single_turn", "interactive", "interactive_first", "multiline_input", "special",
                "verbose_prompt", "simple_io", "log_disable", "stats"):
        if kw[key]:
            s[key] = True
    for key, field in (("escape", "escape"), ("context_shift", "ctx_shift"), ("warmup", "warmup"),
                       ("perf", "perf"), ("display_prompt", "display_prompt"), ("kv_offload", "kv_offload"),
                       ("op_offload", "op_offload"), ("conversation", "conversation")):
        if kw[key] is not None:
            s[field] = kw[key]
    if kw["perf"] is not None:
        sp["no_perf"] = not kw["perf"]
    s["antiprompt"] = tuple(_b(r) for r in kw["reverse_prompt"])
    if kw["in_prefix"] is not None:
        s["input_prefix"], s["enable_chat_template"] = _b(kw["in_prefix"]), False
    if kw["in_suffix"] is not None:
        s["input_suffix"], s["enable_chat_template"] = _b(kw["in_suffix"]), False
    if kw["in_prefix_bos"]:
        s["input_prefix_bos"], s["enable_chat_template"] = True, False
    if kw["chat_template"] is not None:
        s["chat_template"] = _b(kw["chat_template"])
    if kw["chat_template_file"] is not None:
        s["chat_template"] = _read_file("--chat-template-file", kw["chat_template_file"], strip_newline=False)
    for key in ("gpu_mem", "ram"):
        if kw[key] is not None:
            s[key] = kw[key]
    if kw["expert_slots"] is not None:
        s["expert_slots"] = _convert("--expert-slots", kw["expert_slots"], stoi)
        if s["expert_slots"] < 1:
            raise value_error("--expert-slots", "error: --expert-slots must be at least 1")
    if kw["plan"] is not None:
        if not Path(kw["plan"]).is_file():
            raise value_error("--plan", f"error: failed to open file '{kw['plan']}'")
        s["plan"] = Path(kw["plan"])

    # sampling
    if kw["seed"] is not None:
        sp["seed"] = _convert("-s", kw["seed"], stoul32)
    floats = (("temp", "temp", "--temp"), ("top_p", "top_p", "--top-p"), ("min_p", "min_p", "--min-p"),
              ("top_n_sigma", "top_n_sigma", "--top-nsigma"), ("xtc_probability", "xtc_probability", "--xtc-probability"),
              ("xtc_threshold", "xtc_threshold", "--xtc-threshold"), ("typical", "typ_p", "--typical"),
              ("repeat_penalty", "penalty_repeat", "--repeat-penalty"),
              ("presence_penalty", "penalty_present", "--presence-penalty"),
              ("frequency_penalty", "penalty_freq", "--frequency-penalty"),
              ("dry_multiplier", "dry_multiplier", "--dry-multiplier"), ("dry_base", "dry_base", "--dry-base"),
              ("adaptive_target", "adaptive_target", "--adaptive-target"),
              ("adaptive_decay", "adaptive_decay", "--adaptive-decay"),
              ("dynatemp_range", "dynatemp_range", "--dynatemp-range"),
              ("dynatemp_exp", "dynatemp_exponent", "--dynatemp-exp"),
              ("mirostat_lr", "mirostat_eta", "--mirostat-lr"), ("mirostat_ent", "mirostat_tau", "--mirostat-ent"))
    for key, field, flag in floats:
        value = num(key, flag, stof)
        if value is not None:
            sp[field] = value
            user_set.add(field)
    for key, field, flag in (("top_k", "top_k", "--top-k"), ("repeat_last_n", "penalty_last_n", "--repeat-last-n"),
                             ("dry_allowed_length", "dry_allowed_length", "--dry-allowed-length"),
                             ("dry_penalty_last_n", "dry_penalty_last_n", "--dry-penalty-last-n"),
                             ("mirostat", "mirostat", "--mirostat")):
        value = num(key, flag, stoi)
        if value is not None:
            sp[field] = value
            user_set.add(field)
    if "temp" in sp:
        sp["temp"] = max(sp["temp"], 0.0)
    if "penalty_repeat" in sp:
        r = sp["penalty_repeat"]
        if not math.isfinite(r) or r <= 0 or not math.isfinite(1.0 / r):
            raise value_error("--repeat-penalty", "error: repeat-penalty must be finite and greater than 0")
    for field, flag in (("penalty_last_n", "--repeat-last-n"), ("dry_penalty_last_n", "--dry-penalty-last-n")):
        if sp.get(field, 0) < 0:
            raise value_error(flag, f"error: invalid {flag[2:]} = {sp[field]}")
    if kw["dry_sequence_breaker"]:
        sp["dry_sequence_breakers"] = tuple(_b(v) for v in kw["dry_sequence_breaker"] if v != "none") \
            if kw["dry_sequence_breaker"][-1] != "none" else ()
    if kw["samplers"] is not None:
        sp["samplers"] = tuple(t for t in map(sampler_type, kw["samplers"].split(";")) if t)
        user_set.add("samplers")
    if kw["sampler_seq"] is not None:
        sp["samplers"] = tuple(SAMPLER_CHARS[c] for c in kw["sampler_seq"] if c in SAMPLER_CHARS)
    if kw["ignore_eos"]:
        sp["ignore_eos"] = True
    if kw["logit_bias"]:
        sp["logit_bias"] = tuple(_convert("-l", v, _logit_bias) for v in kw["logit_bias"])

    s["speculative"] = spec_settings(kw, Settings.speculative)  # the default: n-gram drafting where the plan pays
    settings = Settings(**s, sampling=SamplingSettings(**sp, user_set=frozenset(user_set)))
    if settings.escape:  # common_params_parse_ex: escapes in the prompt, prefix/suffix, reverse prompts
        settings = replace(
            settings,
            prompt=process_escapes(settings.prompt),
            input_prefix=process_escapes(settings.input_prefix),
            input_suffix=process_escapes(settings.input_suffix),
            antiprompt=tuple(process_escapes(a) for a in settings.antiprompt),
            sampling=replace(settings.sampling, dry_sequence_breakers=tuple(
                process_escapes(b) for b in settings.sampling.dry_sequence_breakers)),
        )
    return settings


def _div(a: float, b: float) -> float:
    return a / b if b else math.copysign(math.inf, a)


def _cpu_ffn_overrides(kw: dict) -> tuple[str, ...]:
    """--cpu-moe / --n-cpu-moe / --n-cpu-ffn as -ot rules (llama.cpp appends them in argv order;
    here they follow the -ot rules)."""
    rules = []
    if kw["cpu_moe"]:
        rules.append(f"{FFN_EXPS_REGEX}=CPU")
    for key, flag, regex in (("n_cpu_moe", "-ncmoe", FFN_EXPS_REGEX), ("n_cpu_ffn", "-ncffn", FFN_DENSE_REGEX)):
        if kw[key] is not None:
            n = _convert(flag, kw[key], stoi)
            if n < 0:
                raise value_error(flag, "invalid value")
            rules += [rf"blk\.{i}{regex}=CPU" for i in range(n)]
    return tuple(rules)


def _fit(kw: dict) -> dict:
    """--fit on|off, -fitt MiB per device (the first GPU's is used), -fitc N: common/arg.cpp's rules."""
    out = {}
    if kw["fit"] is not None:
        value = kw["fit"]
        if not (is_truthy(value) or is_falsey(value)):
            raise value_error("--fit", f"error: unknown value for --fit: '{value}'")
        out["fit"] = is_truthy(value)
    if kw["fit_target"] is not None:
        mibs = [_convert("-fitt", v, stoi) for v in kw["fit_target"].split(",")]
        if any(m < 0 for m in mibs):
            raise value_error("-fitt", "invalid value")
        out["fit_target_mib"] = mibs[0]
    if kw["fit_ctx"] is not None:
        out["fit_ctx"] = _convert("-fitc", kw["fit_ctx"], stoi)
        if out["fit_ctx"] < 1:
            raise value_error("-fitc", "invalid value")
    return out


def _kv_override(item: str) -> tuple[str, object]:
    """string_parse_kv_override: KEY=int:N | float:X | bool:true|false | str:TEXT (< 128 bytes)."""
    key, sep, rest = item.partition("=")
    kind, _, value = rest.partition(":")
    if not sep or len(key) >= 128 or kind not in ("int", "float", "bool", "str") or not _:
        raise ValueError(f"error: Invalid type for KV override: {item}")
    if kind == "bool":
        if value not in ("true", "false"):
            raise ValueError(f"error: Invalid type for KV override: {item}")
        return key, value == "true"
    if kind == "str":
        if len(value.encode()) > 127:
            raise ValueError(f"error: Invalid type for KV override: {item}")
        return key, value
    m = re.match(r"\s*[+-]?\d+", value) if kind == "int" else None
    if kind == "int":
        return key, int(m.group()) if m else 0  # std::atol
    try:
        return key, stof(value)  # std::atof
    except ValueError:
        return key, 0.0


def _load_mode(kw: dict) -> str:
    """-lm, or the --mmap/--no-mmap/--mlock spelling of older llama.cpp versions."""
    if kw["load_mode"] is not None:
        if kw["load_mode"] not in LOAD_MODES:
            raise value_error("-lm", "invalid value")
        return kw["load_mode"]
    mmap, mlock = kw["mmap"], kw["mlock"]
    if mlock:
        return "mlock" if mmap is False else "mmap+mlock"
    if mmap is False:
        return "none"
    if mmap is True:
        return "mmap"
    return "auto"
