"""A request while it holds a slot: its prompt's progress through the KV cache, the tokens it generated,
its sampler and its text, and the rules that end it. A preempted one (admission.py) keeps all but its slot
and KV, and evaluates its prompt and generated tokens again when it is admitted again. Engine thread only."""

from __future__ import annotations

import time
from typing import Callable, Optional

from hypura.engine.request import Request
from hypura.engine.sampler import Sampler
from hypura.engine.text import TextStream
from hypura.engine.types import Event, Result, TokenLogprob


class Sequence:
    def __init__(self, request: Request, slot: int, cached: int, sampler: Sampler, text: TextStream,
                 n_ctx: int, is_eog, post: Callable[[Request, Event], None]):
        self.request, self.slot, self.sampler, self.text = request, slot, sampler, text
        self.prompt = request.prompt
        self.feed = request.prompt  # evaluated before its next sample: the prompt (after a preemption, and the reply)
        self.cached = cached  # prompt tokens whose KV came from another sequence (shared prefix)
        self.n_past = cached  # tokens of this sequence in the KV cache
        self.n_ctx = n_ctx
        self._is_eog = is_eog
        self._post = post  # the outbox delivers the step's events together (outbox.py)
        self.generated: list[int] = []
        self.next_token: Optional[int] = None  # sampled, to be decoded by the next step
        self.t_scheduled: Optional[float] = None  # its first step began
        self.t_prompt_done: Optional[float] = None
        self.t_first: Optional[float] = None
        self.t_last: Optional[float] = None
        self.finish_reason: Optional[str] = None

    @property
    def prefilling(self) -> bool:
        return self.n_past < len(self.feed)

    def detach(self) -> None:
        """Preempted: its KV is gone; evaluating its prompt and reply again brings back where it was."""
        self.slot, self.n_past, self.next_token = None, 0, None
        self.feed = self.prompt + self.generated

    def attach(self, slot: int, reused: int) -> None:
        """Admitted again into `slot`, the first `reused` tokens of its feed already in that slot's KV."""
        self.slot, self.n_past = slot, reused

    @property
    def tokens_left(self) -> int:
        """Tokens it may still generate: before max_tokens, and before its context is full (on_token's rules)."""
        return tokens_left(self.request.params, self.n_ctx, len(self.prompt), len(self.generated))

    def on_token(self, token: int, logprob: Optional[TokenLogprob] = None) -> None:
        """Take a sampled token: emit its text, or end the request (finish_reason set)."""
        now = time.perf_counter()
        if self.t_prompt_done is None:
            self.t_prompt_done = now
        p = self.request.params
        if self._is_eog(token) and not p.ignore_eos:
            self.finish_reason = "stop"  # the end-of-generation token is neither text nor counted
            return
        self.generated.append(token)
        self.t_first = self.t_first or now
        self.t_last = now
        self._post(self.request, Event(text=self.text.push(token), token=token, logprob=logprob))
        if self.text.stopped:
            self.finish_reason = "stop"
        elif len(self.generated) == p.max_tokens or len(self.prompt) + len(self.generated) >= self.n_ctx:
            self.finish_reason = "length"  # max_tokens, or the sequence's context is full
        else:
            self.next_token = token

    def result(self, reason: str, error: Optional[str] = None) -> tuple[Result, str]:
        """The Result, and the text released only now (held back until the end)."""
        last = self.text.flush()
        now = time.perf_counter()
        start = self.t_scheduled or now
        prompt_end = self.t_prompt_done or now
        decode_s = self.t_last - self.t_first if self.t_first is not None else 0.0
        return Result(text=self.text.text, tokens=tuple(self.generated), finish_reason=reason,
                      prompt_tokens=len(self.prompt), cached_tokens=self.cached,
                      queued_s=start - self.request.submitted, prompt_s=prompt_end - start,
                      decode_s=decode_s, error=error,
                      ttft_s=None if self.t_prompt_done is None else self.t_prompt_done - self.request.submitted), last


def tokens_left(params, n_ctx: int, n_prompt: int, n_generated: int) -> int:
    """Tokens a request may still generate: before max_tokens, and before its context is full."""
    room = n_ctx - n_prompt - n_generated
    return room if params.max_tokens == -1 else min(room, params.max_tokens - n_generated)
