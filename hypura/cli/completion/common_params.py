"""`hypura-cli`'s settings: llama-completion's `common_params`, with the same defaults.

Defaults are those of the vendored llama.cpp (common/common.h, and common/arg.cpp's per-tool
overrides for LLAMA_EXAMPLE_COMPLETION: jinja off). Prompts are bytes, as llama.cpp sees them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hypura.cli.completion.device_flags import DeviceSettings
from hypura.speculative.settings import SpecSettings

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# common_sampler_type names (common/sampling.cpp), and their --sampler-seq letters
SAMPLER_TYPES = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "infill",
                 "penalties", "adaptive_p")
SAMPLER_CHARS = {
    "d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
    "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p",
}
_SAMPLER_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}


def sampler_type(name: str):
    """common_sampler_types_from_names for one name: canonical, kebab-case, no-dash or alias."""
    n = name.lower()
    for t in SAMPLER_TYPES:
        if n in (t, t.replace("_", "-"), t.replace("_", "")):
            return t
    return _SAMPLER_ALIASES.get(n)


DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")

# KV cache types llama.cpp accepts for -ctk/-ctv (common/arg.cpp kv_cache_types), with ggml ids
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}

LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")

# common.h: the tensor patterns behind --cpu-moe / --n-cpu-moe / --n-cpu-ffn
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
FFN_DENSE_REGEX = r"\.ffn_(up|down|gate)\."


@dataclass(frozen=True)
class SamplingSettings:
    """common_params_sampling. `user_set` names the fields given on the command line: the
    others may be replaced by the model's `general.sampling.*` metadata, as llama.cpp does."""

    seed: int = LLAMA_DEFAULT_SEED
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.10
    typ_p: float = 1.0
    temp: float = 0.80
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: tuple[bytes, ...] = (b"\n", b":", b'"', b"*")
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.90
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.10
    top_n_sigma: float = -1.0
    ignore_eos: bool = False
    no_perf: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    user_set: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Settings:
    """common_params, for the fields llama-completion reads (plus Hypura's own)."""

    model: Optional[Path] = None  # None: the default model
    prompt: bytes = b""
    system_prompt: bytes = b""
    n_predict: int = -1
    n_ctx: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    n_keep: int = 0
    n_threads: int = -1  # -1: physical cores, as llama.cpp's cpu_get_num_math() (fewer if paging)
    n_threads_batch: int = -1  # -1: same as n_threads
    n_gpu_layers: int = -1  # -1 auto, <= -2 all
    override_tensor: tuple[str, ...] = ()
    flash_attn: Optional[bool] = None  # None: auto
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    load_mode: str = "auto"
    swa_full: bool = False
    repack: bool = True  # llama_model_params.use_extra_bufts
    no_host: bool = False
    check_tensors: bool = False
    kv_overrides: tuple[tuple[str, object], ...] = ()  # --override-kv KEY=TYPE:VALUE
    numa: Optional[str] = None  # distribute | isolate | numactl
    rope_scaling: Optional[str] = None  # none | linear | yarn; None: from the model
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_beta_fast: float = -1.0
    yarn_orig_ctx: int = 0
    kv_offload: bool = True
    op_offload: bool = True
    escape: bool = True
    simple_io: bool = False
    color: Optional[bool] = None  # None: when stdout is a terminal
    display_prompt: bool = True
    verbose_prompt: bool = False
    conversation: Optional[bool] = None  # None: auto (when the model has a chat template)
    single_turn: bool = False
    interactive: bool = False
    interactive_first: bool = False
    multiline_input: bool = False
    antiprompt: tuple[bytes, ...] = ()
    input_prefix: bytes = b""
    input_suffix: bytes = b""
    input_prefix_bos: bool = False
    enable_chat_template: bool = True  # --in-prefix / --in-suffix turn it off, as in llama.cpp
    chat_template: Optional[bytes] = None
    special: bool = False
    ctx_shift: bool = False
    warmup: bool = True
    perf: bool = True  # llama-completion reports timings unless --no-perf
    verbosity: int = 3  # LOG_LEVEL_INFO
    log_disable: bool = False
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    # Hypura's own
    gpu_mem: Optional[str] = None
    ram: Optional[str] = None
    plan: Optional[Path] = None
    expert_slots: Optional[int] = None
    stats: bool = False
    # hypura.speculative's; None: plain decoding. The default, auto: n-gram drafting where the plan makes it pay
    speculative: Optional[SpecSettings] = SpecSettings(type="auto")
    devices: DeviceSettings = field(default_factory=DeviceSettings)  # --rpc, -dev, -sm, -ts, -mg, --rpc-mem
    # llama.cpp's --fit, -fitt (MiB left free on the GPU), -fitc (smallest context it may choose)
    fit: bool = True
    fit_target_mib: int = 1024
    fit_ctx: int = 4096
    placement_set: bool = False  # -ngl (but "auto"), -ot, -cmoe, -ncmoe, -ncffn, --expert-slots: no --fit
