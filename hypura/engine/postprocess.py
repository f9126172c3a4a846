"""Postprocess: a decoded step's samples taken, its drafts verified, its text emitted, its sequences ended.

Engine thread only, holding the step lock, right after the step's llama_decode (runner.py): each sequence with
logits in the step samples (a greedy one takes the argmax read already) or, when speculating, verifies its draft
(speculate.py: the rejected tokens' KV cells are removed before the next step); each sampled token goes to its
sequence (sequence.py), whose events wait in the outbox for the next delivery; a sequence that ends is finished
by the scheduler. A step whose decode failed ends its sequences with finish_reason "error" (their KV freed),
except that with kv_unified a decode that found no cells preempts the youngest sequence and the step runs
again. The counters are updated under the inbox's lock, which metrics() reads.
"""

from __future__ import annotations

import time
from typing import Optional

from hypura.engine.inbox import Inbox
from hypura.engine.metrics import SpecCounters
from hypura.engine.runner import Ran
from hypura.engine.sampler import token_logprob
from hypura.engine.scheduler import Scheduler
from hypura.engine.sequence import Sequence
from hypura.engine.speculate import Speculation
from hypura.engine.step import Step


class Postprocessor:
    def __init__(self, llm, scheduler: Scheduler, spec: Optional[Speculation], inbox: Inbox):
        self.ctx, self.scheduler, self.spec, self.inbox = llm.ctx, scheduler, spec, inbox

    def postprocess(self, step: Step, ran: Ran) -> None:
        if ran.error is not None:
            self._failed(step, ran)
            return
        if self.spec is not None and step.decode_only:
            self.spec.record_step(step.n_tokens, ran.decode_s, step.draft_s)
        generated, spec = 0, SpecCounters()
        seq_draft_s = step.draft_s / max(sum(not c.prompt for c in step.chunks), 1)  # drafting time, per sequence
        for chunk, start in zip(step.chunks, ran.first):
            seq = chunk.seq
            if chunk.draft or (self.spec and not chunk.prompt):
                out = self.spec.verify(chunk, start, ran.picks, self.scheduler.slots, spec, ran.decode_s, seq_draft_s)
                generated += self._emit(seq, out, start)
                continue
            index = start + len(chunk.tokens) - 1
            seq.n_past += len(chunk.tokens)
            self.scheduler.slots.extend(seq.slot, chunk.tokens)
            seq.next_token = None
            if chunk.sample:
                token = ran.picks.get(index, -1) if ran.picks else -1
                generated += self._emit(seq, [token if token >= 0 else seq.sampler.sample(self.ctx, index)], index)
        with self.inbox.lock:
            c = self.inbox.counters
            c.step(time.perf_counter() - step.t0, step.prompt_tokens, generated)
            if spec.passes:
                s = c.spec
                s.steps, s.passes = s.steps + 1, s.passes + spec.passes
                s.drafted, s.accepted = s.drafted + spec.drafted, s.accepted + spec.accepted
                s.draft_seconds += step.draft_s

    def _failed(self, step: Step, ran: Ran) -> None:
        scheduler = self.scheduler
        if ran.rc == 1 and scheduler.cells is not None and len(scheduler.active) > 1:  # no cells after all: make room
            scheduler.preempt_youngest()
            return
        with self.inbox.lock:
            self.inbox.counters.failed_steps += 1
        for seq in {c.seq: None for c in step.chunks}:
            scheduler.finish(seq, "error", ran.error)

    def _emit(self, seq: Sequence, tokens: list[int], start: int) -> int:
        """Hand `seq` its sampled tokens (the first's logits at batch index `start`) until one ends it."""
        top_n = seq.request.params.logprobs
        for i, token in enumerate(tokens):
            seq.on_token(token, None if top_n is None else token_logprob(self.ctx, start + i, token, top_n))
            if seq.finish_reason is not None:
                self.scheduler.finish(seq, seq.finish_reason)
                break
        return len(tokens)
