"""What the batched engine takes and gives: a request's sampling settings, the events it streams, its
result, and the errors `Engine.submit` raises. The HTTP server and `hypura bench --parallel` speak only
these types and the Engine's methods (hypura/engine/__init__.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from hypura.errors import HypuraError

FINISH_REASONS = ("stop", "length", "cancelled", "error")
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class SamplingParams:
    """One request's generation settings, with llama.cpp's sampler meanings (common/sampling.cpp)."""

    max_tokens: int = 128  # -1: until a stop, end of generation or the sequence's context is full
    temperature: float = 0.8  # <= 0: greedy (argmax)
    top_k: int = 40  # <= 0: off
    top_p: float = 0.95  # 1.0: off
    min_p: float = 0.05  # 0.0: off
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = 64  # tokens the penalties look back over
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: Optional[int] = None  # None: a random seed per request
    stop: tuple[str, ...] = ()  # generation ends before the first of these strings (not returned)
    ignore_eos: bool = False
    # llama.cpp's other samplers (hypura-cli's flags), at their neutral values: left out of the chain
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) first in the chain
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[bytes, ...] = (b"\n", b":", b'"', b"*")
    mirostat: int = 0  # 1 or 2: temperature then mirostat (v2) instead of the chain
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.9
    # None: the default order, neutral stages left out, greedy at temperature <= 0; else exactly these
    # stages in this order, as common_sampler builds --samplers (llama.cpp's names, e.g. "top_k", "xtc")
    samplers: Optional[tuple[str, ...]] = None
    perf: bool = False  # the chain keeps llama_perf_sampler timings
    grammar: Optional[str] = None  # GBNF (llama.cpp's grammars/README.md), rule `root`: only what it allows is sampled
    logprobs: Optional[int] = None  # report each token's log-probability and this many top alternatives (0..20)

    def __post_init__(self):
        bad = []
        if self.max_tokens < -1 or self.max_tokens == 0:
            bad.append(f"max_tokens {self.max_tokens} (want >= 1, or -1 for no limit)")
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                bad.append(f"{name} {getattr(self, name)} (want a finite number)")
        if not 0.0 <= self.top_p <= 1.0 or not 0.0 <= self.min_p <= 1.0:
            bad.append(f"top_p {self.top_p} / min_p {self.min_p} (want 0..1)")
        if self.repeat_penalty <= 0 or self.repeat_last_n < -1:
            bad.append(f"repeat_penalty {self.repeat_penalty} / repeat_last_n {self.repeat_last_n} (want > 0 / >= -1)")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            bad.append(f"seed {self.seed} (want 0 .. 2^32-1)")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad.append("stop (want non-empty strings)")
        if self.grammar is not None and (not isinstance(self.grammar, str) or self.ignore_eos):
            bad.append("grammar (want GBNF text, without ignore_eos: a grammar ends at its end-of-generation token)")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            bad.append(f"logprobs {self.logprobs} (want 0 .. {MAX_TOP_LOGPROBS})")
        if bad:
            raise HypuraError("bad sampling settings: " + "; ".join(bad))


@dataclass(frozen=True)
class Event:
    """What a running request reports, in order: text as it is generated, then one final event."""

    text: str  # new text since the previous event (held back while it may still start a stop string)
    token: Optional[int] = None  # the token that produced it; None on the final event
    finish_reason: Optional[str] = None  # set on the final event only: one of FINISH_REASONS
    error: Optional[str] = None  # with finish_reason "error": why
    logprob: Optional["TokenLogprob"] = None  # with SamplingParams.logprobs: the token's and its top alternatives'


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model (before sampling settings) and the best others."""

    logprob: float
    top: tuple[tuple[int, float], ...]  # (token, logprob), most likely first


@dataclass(frozen=True)
class Result:
    """A finished request: what it generated and what it cost."""

    text: str
    tokens: tuple[int, ...]  # generated token ids
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens, reused from an earlier sequence's KV (shared prefix)
    queued_s: float  # from submit() to its first scheduled step
    prompt_s: float  # evaluating the prompt (its chunks' steps)
    decode_s: float  # from the first generated token to the last
    error: Optional[str] = None
    ttft_s: Optional[float] = None  # from submit() to its first sampled token (None: it never got one)

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    @property
    def prompt_tok_s(self) -> Optional[float]:
        """The prompt tokens evaluated (not reused) a second, None when none were or no time was measured."""
        evaluated = self.prompt_tokens - self.cached_tokens
        return evaluated / self.prompt_s if evaluated > 0 and self.prompt_s > 0 else None

    @property
    def decode_tok_s(self) -> Optional[float]:
        """Tokens generated a second after the first (its time is the prompt's); None below two tokens."""
        n = self.completion_tokens
        return (n - 1) / self.decode_s if n > 1 and self.decode_s > 0 else None


class QueueFull(HypuraError):
    """Too many requests wait already (EngineConfig.max_queue): try again later."""


class PromptTooLong(HypuraError):
    """The prompt (and at least one generated token) does not fit a sequence's context."""


class EngineClosed(HypuraError):
    """The engine was closed: no new requests."""
