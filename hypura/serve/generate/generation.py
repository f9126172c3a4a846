"""What both APIs do to run a request: prompt tokens (a rendered chat template, text or token ids),
the context check, and submission to the engine with its errors mapped to HTTP (whole replies: tools/replies.py).

Rendering and tokenizing run on a thread of their own (lifecycle.off_loop), bounded (models/prompt_tokens.py) and
stopped when the request goes: a long conversation, or a hostile template running into its bounds, never
stalls the loop that streams every other request, nor the server's shutdown.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from hypura.chat_template import TemplateError, TemplateRejected
from hypura.engine import EngineClosed, PromptTooLong, QueueFull, SamplingParams
from hypura.errors import HypuraError
from hypura.serve.generate.bridge import EngineStream
from hypura.serve.http import lifecycle, request_log
from hypura.serve.http.errors import ApiError
from hypura.serve.models import prompt_tokens
from hypura.serve.models.entry import ModelEntry

RETRY_AFTER_S = "1"  # a queue slot frees when any running request ends: ask for a quick retry
PROMPT_DEADLINE_S = 30.0  # rendering and tokenizing one prompt, bounded as they are, end well before this


async def chat_tokens(entry: ModelEntry, messages: list[dict], **template_vars) -> list[int]:
    return (await chat_prompt(entry, messages, **template_vars))[1]


async def chat_prompt(entry: ModelEntry, messages: list[dict], **template_vars) -> tuple[str, list[int]]:
    """The conversation through the model's chat template, tokenized as llama-cpp-python does after a
    Jinja template: special tokens parsed, no BOS added (the template writes its own). (text, tokens)"""
    template = entry.chat_template()
    if len(messages) >= entry.n_ctx:  # every template writes a token or more per message
        raise prompt_tokens.too_long(entry.n_ctx, f"a conversation of {len(messages)} messages")
    prompt_tokens.check_chars(entry.vocab, entry.n_ctx, sum(len(m.get("content") or "") for m in messages
                                                            if isinstance(m.get("content"), str)))

    def run(cancelled) -> tuple[str, list[int]]:
        text = template.render(messages, add_generation_prompt=True, **template_vars)
        return text, _tokenize(entry, text, False, cancelled)

    try:
        return await lifecycle.off_loop(run, PROMPT_DEADLINE_S)
    except TemplateRejected as e:
        raise ApiError(400, str(e)) from None
    except TemplateError as e:
        raise ApiError(500, f"model '{entry.name}': {e}") from None


async def text_tokens(entry: ModelEntry, text: str) -> list[int]:
    """A raw prompt, as llama-cpp-python's create_completion tokenizes it (BOS as the model wants)."""
    prompt_tokens.check_chars(entry.vocab, entry.n_ctx, len(text))
    return await lifecycle.off_loop(lambda cancelled: _tokenize(entry, text, True, cancelled), PROMPT_DEADLINE_S)


def _tokenize(entry: ModelEntry, text: str, add_special: bool, cancelled) -> list[int]:
    return prompt_tokens.tokenize(entry.engine.tokenize, entry.vocab, text, add_special, True, entry.n_ctx, cancelled)


async def fim_tokens(entry: ModelEntry, prefix: str, suffix: str) -> list[int]:
    """llama.cpp's server's infill prompt: [BOS] <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID> (the text's own
    special-looking strings stay text)."""
    fim = entry.engine.fim_tokens()
    if fim is None:
        raise ApiError(400, f"model '{entry.name}' has no fill-in-the-middle tokens: 'suffix' needs a code model")
    pre, suf, mid = fim
    prompt_tokens.check_chars(entry.vocab, entry.n_ctx, len(prefix) + len(suffix))

    def run(cancelled) -> list[int]:
        bos = entry.engine.tokenize("", add_special=True, parse_special=False)
        text = lambda s: prompt_tokens.tokenize(entry.engine.tokenize, entry.vocab, s, False, False,  # noqa: E731
                                                entry.n_ctx, cancelled)
        return [*bos, pre, *text(prefix), suf, *text(suffix), mid]

    return await lifecycle.off_loop(run, PROMPT_DEADLINE_S)


def checked_token_ids(entry: ModelEntry, tokens, field: str) -> list[int]:
    """Token ids a client sent: ints of this model's vocabulary (llama.cpp would read out of bounds)."""
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ApiError(400, f"'{field}' must be a list of token ids")
    bad = [t for t in tokens if not 0 <= t < entry.n_vocab]
    if bad:
        raise ApiError(400, f"'{field}' has token id {bad[0]}, outside this model's vocabulary "
                            f"(0..{entry.n_vocab - 1})")
    return tokens


@dataclass(frozen=True)
class Job:
    """A request ready for the engine."""

    entry: ModelEntry
    tokens: list[int]
    params: SamplingParams


def make_job(entry: ModelEntry, tokens: list[int], params: SamplingParams, n_ctx: Optional[int] = None) -> Job:
    """Check that the prompt leaves room for a token in the context (`n_ctx`, at most the server's per
    sequence), and bound max_tokens by what is left of it."""
    limit = entry.n_ctx if n_ctx is None else min(n_ctx, entry.n_ctx)
    if not tokens:
        raise ApiError(400, "the prompt is empty")
    if len(tokens) >= limit:
        raise ApiError(400, f"the prompt is {len(tokens)} tokens, but the context is {limit} tokens per "
                            f"request (prompt and reply together): shorten it", "context_length_exceeded")
    room = limit - len(tokens)
    if params.max_tokens == -1 or params.max_tokens > room:
        params = dataclasses.replace(params, max_tokens=room)
    return Job(entry, tokens, params)


def sampling(**fields) -> SamplingParams:
    """SamplingParams from request fields (None: the default); its own check becomes a 400."""
    try:
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    except HypuraError as e:
        raise ApiError(400, str(e)) from None


def submit(job: Job) -> EngineStream:
    try:
        stream = EngineStream(job.entry.engine, job.tokens, job.params)
    except QueueFull:
        raise ApiError(429, "the server is busy: too many requests are waiting; retry shortly",
                       "rate_limit_exceeded", {"Retry-After": RETRY_AFTER_S}) from None
    except PromptTooLong as e:
        raise ApiError(400, str(e), "context_length_exceeded") from None
    except EngineClosed:
        raise ApiError(503, "the server is shutting down") from None
    except HypuraError as e:  # what else the engine refuses in a request
        raise ApiError(400, str(e)) from None
    request_log.add(job.entry.name, stream)  # its costs go into the request's log line and /metrics
    return stream
