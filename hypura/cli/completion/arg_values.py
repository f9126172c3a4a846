"""llama.cpp's command-line conventions, for `hypura-cli`: how values parse, how argv is checked.

llama.cpp's parser (common/arg.cpp) is strict where click is lenient: every token must be a known
flag or the value of the flag before it, and values are read with std::stoi/stof/stoul (a numeric
prefix is enough, "12abc" is 12). `check_argv` applies llama.cpp's rules before click sees argv,
so an unknown flag fails the way llama-completion fails instead of being split into short options.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

import click

# Every flag the vendored llama-completion (llama-cpp-python 0.3.36) accepts, from its --help.
# A flag in this set that hypura-cli does not define is rejected with a pointer to docs/cli.md.
LLAMA_COMPLETION_FLAGS = frozenset("""
-h --help --usage --version -cl --cache-list --completion-bash -t --threads -tb --threads-batch -C
--cpu-mask -Cr --cpu-range --cpu-strict --prio --poll -Cb --cpu-mask-batch -Crb --cpu-range-batch
--cpu-strict-batch --prio-batch --poll-batch -c --ctx-size -n --predict --n-predict -b --batch-size -ub
--ubatch-size --keep --swa-full -fa --flash-attn -p --prompt --perf --no-perf -f --file -bf
--binary-file -e --escape --no-escape --rope-scaling --rope-scale --rope-freq-base --rope-freq-scale
--yarn-orig-ctx --yarn-ext-factor --yarn-attn-factor --yarn-beta-slow --yarn-beta-fast -kvo
--kv-offload -nkvo --no-kv-offload --repack -nr --no-repack --no-host -ctk --cache-type-k -ctv
--cache-type-v -dt --defrag-thold -np --parallel --rpc -lm --load-mode -lzm --lazy-mode --numa -dev
--device --list-devices -ot --override-tensor -cmoe --cpu-moe -ncmoe --n-cpu-moe -ncffn --n-cpu-ffn
-ngl --gpu-layers --n-gpu-layers -sm --split-mode -ts --tensor-split -mg --main-gpu -fit --fit -fitt
--fit-target -fitc --fit-ctx --check-tensors --override-kv --op-offload --no-op-offload --lora
--lora-scaled --control-vector --control-vector-scaled --control-vector-layer-range -m --model -mu
--model-url -dr --docker-repo -hf -hfr --hf-repo -hff --hf-file -hft --hf-token --log-disable
--log-file --log-jsonl --no-log-jsonl --log-colors -v --verbose --log-verbose --offline -lv
--verbosity --log-verbosity --log-prefix --no-log-prefix --log-timestamps --no-log-timestamps
--spec-draft-type-k -ctkd --cache-type-k-draft --spec-draft-type-v -ctvd --cache-type-v-draft
--samplers -s --seed --sampler-seq --sampling-seq --ignore-eos --temp --temperature --top-k --top-p
--min-p --top-nsigma --top-n-sigma --xtc-probability --xtc-threshold --typical --typical-p
--repeat-last-n --repeat-penalty --presence-penalty --frequency-penalty --dry-multiplier --dry-base
--dry-allowed-length --dry-penalty-last-n --dry-sequence-breaker --adaptive-target --adaptive-decay
--dynatemp-range --dynatemp-exp --mirostat --mirostat-lr --mirostat-ent -l --logit-bias --grammar
--grammar-file -j --json-schema -jf --json-schema-file -bs --backend-sampling --verbose-prompt
--display-prompt --no-display-prompt -co --color --context-shift --no-context-shift -sys
--system-prompt -sysf --system-prompt-file -ptc --print-token-count --prompt-cache --prompt-cache-all
--prompt-cache-ro -r --reverse-prompt -sp --special -cnv --conversation -no-cnv --no-conversation -st
--single-turn -i --interactive -if --interactive-first -mli --multiline-input --in-prefix-bos
--in-prefix --in-suffix --warmup --no-warmup -gan --grp-attn-n -gaw --grp-attn-w --jinja --no-jinja
--reasoning-format -rea --reasoning --reasoning-effort --reasoning-budget --reasoning-budget-message
--reasoning-preserve --no-reasoning-preserve --chat-template --chat-template-file --skip-chat-parsing
--no-skip-chat-parsing --simple-io
""".split())


class ArgvError(Exception):
    """A command line llama.cpp would reject; the message is llama.cpp's one-line error."""


def invalid_argument(arg: str) -> ArgvError:
    if arg in LLAMA_COMPLETION_FLAGS:
        return ArgvError(f"error: invalid argument: {arg} (a llama-completion flag hypura-cli does not "
                         "support; see docs/cli.md)")
    return ArgvError(f"error: invalid argument: {arg}")


def value_error(arg: str, message: str) -> ArgvError:
    return ArgvError(f'error while handling argument "{arg}": {message}')


def option_arity(command: click.Command) -> dict[str, str]:
    """Flag name -> "flag" | "value" | "optional" (a value unless the next token is a flag)."""
    arity = {name: "flag" for name in (command.context_settings or {}).get("help_option_names", ())}
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        kind = "flag" if param.is_flag else ("optional" if param._flag_needs_value else "value")
        for name in list(param.opts) + list(param.secondary_opts):
            arity[name] = kind
    return arity


def _looks_like_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1


def check_argv(argv: Iterable[str], arity: dict[str, str]) -> list[str]:
    """Reject what llama.cpp rejects; return argv with `--long_name` spelled `--long-name`."""
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name.startswith("--"):
            name = name.replace("_", "-")  # llama.cpp accepts --n_predict for --n-predict
        kind = arity.get(name)
        if kind is None:
            raise invalid_argument(arg if not _looks_like_flag(arg) else name)
        out.append(name + eq + value)
        i += 1
        if eq:
            if kind == "flag":
                raise value_error(name, "this flag takes no value")
            continue
        if kind == "value":
            if i >= len(args):
                raise value_error(name, "expected value for argument")
            out.append(args[i])
            i += 1
        elif kind == "optional" and i < len(args) and not _looks_like_flag(args[i]):
            out.append(args[i])
            i += 1
    return out


# std::stoi / std::stof / std::stoul: leading whitespace, then the longest numeric prefix.
_INT_RE = re.compile(r"\s*([+-]?\d+)")
_FLOAT_RE = re.compile(
    r"\s*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))", re.IGNORECASE
)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def stoi(text: str) -> int:
    m = _INT_RE.match(text)
    if not m:
        raise ValueError(f"invalid integer '{text}'")
    value = int(m.group(1))
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"integer '{text}' out of range")
    return value


def stof(text: str) -> float:
    m = _FLOAT_RE.match(text)
    if not m:
        raise ValueError(f"invalid number '{text}'")
    return float(m.group(1))


def stoul32(text: str) -> int:
    """std::stoul stored in a uint32 (llama.cpp's seed): -1 wraps to 0xFFFFFFFF, the random seed."""
    m = _INT_RE.match(text)
    if not m:
        raise ValueError(f"invalid integer '{text}'")
    return int(m.group(1)) % 2**32


def is_truthy(v: str) -> bool:
    return v in ("on", "enabled", "true", "1")


def is_falsey(v: str) -> bool:
    return v in ("off", "disabled", "false", "0")


def is_autoy(v: str) -> bool:
    return v in ("auto", "-1")


def on_off_auto(flag: str, value: str) -> Optional[bool]:
    """llama.cpp's [on|off|auto] values: True, False, or None for auto."""
    if is_truthy(value):
        return True
    if is_falsey(value):
        return False
    if is_autoy(value):
        return None
    raise ValueError(f"error: unknown value for {flag}: '{value}'")


def process_escapes(data: bytes) -> bytes:
    r"""common's string_process_escapes, on bytes: \n \r \t \' \" \\ and \xHH (a raw byte)."""
    simple = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        if c == 0x5C and i + 1 < n:  # backslash
            i += 1
            e = data[i]
            if e in simple:
                out += simple[e]
            elif e == ord("x") and i + 2 < n and _HEX2.fullmatch(data[i + 1:i + 3]):
                out.append(int(data[i + 1:i + 3], 16))
                i += 2
            else:
                out += bytes((0x5C, e))
        else:
            out.append(c)
        i += 1
    return bytes(out)


_HEX2 = re.compile(rb"[0-9a-fA-F]{2}")
