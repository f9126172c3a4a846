"""Schedule: what the next step carries, and the sequences that hold the slots.

Engine thread only, holding the step lock; it reads and changes the waiting queue only under the inbox's lock
(inbox.py). `schedule()` runs before every step:

1. sequences whose requests were cancelled end (llama_memory_seq_rm frees their KV);
2. waiting requests take free slots (oldest first; a shared prefix copied, prefix_cache.py); with kv_unified,
   the queue's head joins while a slot is free and its cells fit (admission.py);
3. every decoding sequence drafts when speculating (speculate.py);
4. the step: every decoding sequence's next token and its draft, then prompt chunks (step.py); with kv_unified
   within the cells, the youngest sequences preempted (their KV given back, their requests at the queue's front)
   until it fits.

`finish()` ends a sequence (its slot cached or freed, its result posted to the outbox); postprocess.py calls it
when a sequence ends, the engine when it stops.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Optional

from hypura.engine.admission import CellAdmission, place
from hypura.engine.inbox import Inbox
from hypura.engine.outbox import Outbox
from hypura.engine.prefix_cache import Choice, Slots
from hypura.engine.request import Request
from hypura.engine.sampler import Sampler
from hypura.engine.sequence import Sequence, tokens_left
from hypura.engine.speculate import Speculation
from hypura.engine.step import Step, plan_step
from hypura.engine.text import TextStream
from hypura.engine.types import Result

log = logging.getLogger("hypura.engine")


class Scheduler:
    def __init__(self, llm, slots: Slots, cells: Optional[CellAdmission], spec: Optional[Speculation],
                 inbox: Inbox, outbox: Outbox, n_ctx_per_seq: int, step_tokens: int):
        """llm: the engine's hypura.loaded.LoadedModel; cells: kv_unified's admission (None: off)."""
        self.llm, self.kv, self.vocab = llm, llm.context, llm.vocab
        self.slots, self.cells, self.spec = slots, cells, spec
        self.inbox, self.outbox = inbox, outbox
        self.n_ctx_per_seq, self.step_tokens = n_ctx_per_seq, step_tokens
        self.active: list[Sequence] = []  # in admission order: the last is the youngest

    def free_slots(self) -> Optional[int]:
        """Slots the loop fills from the queue's head; None with kv_unified, whose queue schedule() serves."""
        return None if self.cells is not None else self.slots.free

    def schedule(self, admit: list[Request]) -> Optional[Step]:
        """The next step, `admit` admitted first (kv_unified: the queue's head, while it fits); None: nothing runs."""
        for seq in [s for s in self.active if s.request.cancel_requested]:
            self.finish(seq, "cancelled")
        for request in admit:
            self._admit(request)
        if self.cells is not None:
            self._admit_by_cells()
        if not self.active:
            return None
        t0 = time.perf_counter()
        drafts, draft_s = self.spec.drafts(self.active) if self.spec else ({}, 0.0)
        if self.spec is not None and self.spec.aside:
            with self.inbox.lock:
                self.inbox.counters.spec.aside_steps += 1
        step = self._plan(drafts)
        for chunk in step.chunks:
            chunk.seq.t_scheduled = chunk.seq.t_scheduled or t0
        return dataclasses.replace(step, t0=t0, draft_s=draft_s)

    def _admit(self, request: Request, choice: Optional[Choice] = None) -> None:
        if request.cancel_requested:  # cancelled on its way out of the queue
            self.end_waiting(request, "cancelled")
            return
        seq = self.inbox.resumed(request)
        feed = request.prompt if seq is None else seq.feed
        choice = choice or self.slots.choose(feed)
        reuse = place(self.kv, self.slots, choice, feed, len(request.prompt))
        if seq is not None:  # preempted before: evaluate its prompt and reply again (admission.py)
            seq.attach(choice.slot, reuse)
            self.active.append(seq)
            with self.inbox.lock:
                self.inbox.counters.recomputed_tokens += len(feed) - reuse
            return
        n_vocab = self.vocab.n_tokens
        sampler = Sampler(request.params, n_vocab, self.n_ctx_per_seq, self.vocab.vocab)
        sampler.accept_prompt(request.prompt)
        text = TextStream(self._piece, request.params.stop)
        seq = Sequence(request, choice.slot, reuse, sampler, text, self.n_ctx_per_seq, self.vocab.is_eog,
                       self.outbox.post)
        self.active.append(seq)
        with self.inbox.lock:
            self.inbox.counters.prompt_tokens += len(request.prompt)
            self.inbox.counters.cached_tokens += reuse

    def _admit_by_cells(self) -> None:
        """kv_unified: the queue's head joins while a slot is free and its cells fit (admission.py)."""
        inbox = self.inbox
        while True:
            with inbox.lock:
                if not inbox.waiting or not self.slots.free:
                    self.cells.blocked = False
                    return
                request = inbox.waiting[0]
                seq = inbox.preempted.get(request)
                feed = request.prompt if seq is None else seq.feed
                generated = len(seq.generated) if seq else 0
                left = tokens_left(request.params, self.n_ctx_per_seq, len(request.prompt), generated)
                choice = self.slots.choose(feed)
                if not self.cells.fits(self.active, feed, choice, left, resumed=seq is not None):
                    return
                inbox.waiting.popleft()
            self._admit(request, choice)

    def _plan(self, drafts: dict) -> Step:
        """The next step; kv_unified: within the cells, the youngest sequences preempted until it fits."""
        if self.cells is None:
            return plan_step(self.active, self.step_tokens, drafts)
        while (step := self.cells.plan(self.active, self.step_tokens, drafts)) is None and len(self.active) > 1:
            self.preempt_youngest()
            drafts = {s: d for s, d in drafts.items() if s in self.active}
        if step is None:  # alone, it fits the whole cache (its limit): nothing cached stays in its way
            self.cells.evict(self.cells.n_cells)
            step = plan_step(self.active, self.step_tokens, drafts)
        return step

    def preempt_youngest(self) -> None:
        """The last admitted sequence gives its KV back and waits at the queue's front to be recomputed."""
        seq = self.active[-1]
        self.active.remove(seq)
        self.kv.seq_rm(seq.slot)
        self.slots.release(seq.slot, keep=False)
        seq.detach()
        self.inbox.requeue(seq.request, seq)
        log.debug("preempted request %d: %d tokens to evaluate again", seq.request.id, len(seq.feed))

    def finish(self, seq: Sequence, reason: str, error: Optional[str] = None) -> None:
        """End `seq`: a completed one ("stop", "length") leaves its KV cached in the slot, others free it."""
        if seq.slot is not None:  # else preempted, waiting: it holds neither slot nor KV
            self.active.remove(seq)
            keep = reason in ("stop", "length")
            if not keep:
                self.kv.seq_rm(seq.slot)
            self.slots.release(seq.slot, keep)
            if not self.slots.cache and keep:
                self.kv.seq_rm(seq.slot)
        seq.sampler.close()
        result, last = seq.result(reason, error)
        self.inbox.count_finish(reason)
        self.outbox.finish(seq.request, result, last)

    def end_waiting(self, request: Request, finish_reason: str, error: Optional[str] = None) -> None:
        """End a request that holds no slot: cancelled or refused while it waited."""
        seq = self.inbox.resumed(request)
        if seq is not None:  # preempted: what it generated before is its result
            self.finish(seq, finish_reason, error)
            return
        queued = time.perf_counter() - request.submitted
        self.inbox.count_finish(finish_reason)
        self.outbox.finish(request, Result(text="", tokens=(), finish_reason=finish_reason,
                                           prompt_tokens=len(request.prompt), cached_tokens=0, queued_s=queued,
                                           prompt_s=0.0, decode_s=0.0,
                                           error=error if finish_reason == "error" else None))

    def end_all(self, reason: str) -> None:
        """The loop ended: every request, waiting or running, ends ("cancelled" where asked, else "error")."""
        for request in self.inbox.drain():
            self.end_waiting(request, "cancelled" if request.cancel_requested else "error", reason)
        for seq in list(self.active):
            self.finish(seq, "cancelled" if seq.request.cancel_requested else "error", reason)

    def _piece(self, token: int) -> bytes:
        """A token's bytes, special tokens not rendered."""
        return self.vocab.piece(token, False)
