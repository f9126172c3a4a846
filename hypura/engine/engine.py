"""The Engine: one thread that owns the llama.cpp context and runs steps while there is work.

Threading protocol:

- `submit()` (any thread) checks the request, appends it to the waiting queue under the engine's lock
  (QueueFull beyond EngineConfig.max_queue) and wakes the loop. `cancel()` marks the request and wakes
  the loop; a request still waiting leaves the queue at once. Both hold the lock for bookkeeping only.
- The engine thread, between steps: ends cancelled requests (llama_memory_seq_rm frees their KV), gives
  free slots to waiting requests (oldest first; shared prefix copied, see prefix_cache.py; with kv_unified
  while their cells fit, and the youngest preempted where a step's cells run out: admission.py), then runs one
  step: a batch of every decoding sequence's next token (and its draft when speculating, speculate.py) and
  prompt chunks (scheduler.py), one `llm.decode_batch`, and a sample for each sequence with logits in it
  (a speculating sequence's samples verify its draft; the rejected tokens' KV cells are removed before the
  next step). Every Event is emitted from this thread, outside the lock: a step's events together
  (`_deliver`), right before the next step's llama_decode, so that a consumer they wake (the server's
  loop) runs while that decode holds no GIL instead of taking it in the middle of the step's Python
  work; when no step follows, before the loop sleeps. It sleeps when nothing is queued or running.
- A failed llama_decode, or weights that could not be streamed, ends the requests of that step with
  finish_reason "error" (their KV freed); the engine keeps serving the others.
- `metrics()` reads the request counts in one hold of the lock (active is derived from them, so an idle
  engine never shows a request that has not been counted finished) and takes the step lock for
  llm.stats(), so it waits at most one step: a thread waiting for the step lock (`metrics()`, `embed()`)
  counts itself in `_lock_waiters`, and the loop waits at its top until it got the lock. `close()` ends
  every request (finish_reason "error", "engine closed") and joins the thread; the model stays the
  caller's (a draft model is the engine's: closed).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import threading
import time
from typing import Callable, Optional

import llama_cpp

from hypura.bindings.batch import Batch
from hypura.engine.admission import CellAdmission, place
from hypura.engine.batch import fill, greedy_picks
from hypura.engine.config import EngineConfig
from hypura.engine.embed import embed
from hypura.engine.metrics import Counters, SpecCounters, places
from hypura.engine.prefix_cache import Choice, Slots
from hypura.engine.request import Request
from hypura.engine.sampler import Sampler, check_grammar, token_logprob
from hypura.engine.scheduler import Step, plan_step
from hypura.engine.sequence import Sequence, tokens_left
from hypura.engine.sizes import sizes
from hypura.engine.speculate import Speculation
from hypura.engine.text import TextStream
from hypura.engine.types import EngineClosed, Event, PromptTooLong, QueueFull, Result, SamplingParams
from hypura.errors import HypuraError

log = logging.getLogger("hypura.engine")

DECODE_STATUS = {1: "no free KV cells for the batch", 2: "aborted", -1: "invalid batch"}  # llama.h, llama_decode


class Engine:
    def __init__(self, llm, config: EngineConfig = EngineConfig()):
        """llm: a hypura.loaded.LoadedModel (hypura.engine.load makes one with the sequences the engine needs)."""
        self.llm, self.config = llm, config
        self._ctx = llm.ctx
        self._kv = llm.context
        self._vocab = llm.vocab
        self.n_vocab = self._vocab.n_tokens
        size = sizes(llm, config)
        self.n_ctx_per_seq, self.step_tokens = size.n_ctx_per_seq, size.step_tokens
        self._slots = Slots(config.parallel, size.unified, config.prefix_cache, shared_cells=config.kv_unified)
        self._cells = CellAdmission(self._kv, self._slots, self._kv.n_ctx()) if config.kv_unified else None
        self._preempted: dict[Request, Sequence] = {}  # waiting again, to be recomputed (admission.py)
        self._batch = Batch(self.step_tokens)
        self._cond = threading.Condition()  # guards _waiting, _cancelled, _closing, _counters' request counts
        self._step_lock = threading.RLock()  # held while the engine thread uses the context (re-entered by on_event)
        self._lock_waiters = 0  # other threads waiting for the step lock (metrics, embed): the loop lets them in
        self._waiting: collections.deque[Request] = collections.deque()
        self._cancelled: list[Request] = []  # left the queue before a slot: the engine thread ends them
        self._active: list[Sequence] = []
        self._outbox: list[Callable[[], None]] = []  # the events (and results) of the step, in order, for _deliver
        self._counters = Counters()
        self._spec: Optional[Speculation] = None
        if config.speculative is not None:
            # the decode part of a step stays one micro-batch: a second one is a second pass over the weights
            self._spec = Speculation(config.speculative, llm, min(self.step_tokens, self._kv.n_ubatch),
                                     config.parallel, min(size.share, self.n_ctx_per_seq))  # its cache: as ours
            self._counters.spec = SpecCounters()
        self._closing = False
        self._stopped: Optional[str] = None  # why the loop ended (None while it may run)
        self._thread: Optional[threading.Thread] = None
        self._kv.clear()  # sequences start empty: slots own their KV from here

    # --- any thread -----------------------------------------------------------------------------
    def start(self) -> "Engine":
        with self._cond:
            if self._closing:
                raise EngineClosed("the engine was closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hypura-engine", daemon=True)
                self._thread.start()
        return self

    def submit(self, prompt_tokens: list[int], params: SamplingParams = SamplingParams(),
               on_event: Optional[Callable[[Event], None]] = None) -> Request:
        """Queue a request; raises QueueFull, PromptTooLong, EngineClosed, or HypuraError for bad tokens."""
        tokens = list(prompt_tokens)
        if not tokens:
            raise HypuraError("empty prompt: give at least one token")
        if any(not isinstance(t, int) or not 0 <= t < self.n_vocab for t in tokens):
            raise HypuraError(f"prompt tokens must be ids in 0..{self.n_vocab - 1}")
        if len(tokens) + 1 > self.n_ctx_per_seq:
            raise PromptTooLong(f"the prompt has {len(tokens)} tokens; a sequence holds {self.n_ctx_per_seq} "
                                "(prompt and generated tokens)")
        if not isinstance(params, SamplingParams):
            raise HypuraError("params must be a hypura.engine.SamplingParams")
        if params.grammar is not None:
            check_grammar(self._vocab.vocab, params.grammar)  # here, not on the engine thread: a bad one is the caller's error
        request = Request(tokens, params, on_event, self._cancel)
        with self._cond:
            if self._closing or self._stopped:
                raise EngineClosed("the engine was closed" if self._closing else f"the engine stopped: {self._stopped}")
            if len(self._waiting) >= self.config.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests wait already (max_queue {self.config.max_queue})")
            self._waiting.append(request)
            self._counters.submitted += 1
            self._cond.notify()
        return request

    def _cancel(self, request: Request) -> None:
        with self._cond:
            if request in self._waiting:
                self._waiting.remove(request)
                self._cancelled.append(request)
            self._cond.notify()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._vocab.tokenize(text.encode("utf-8"), add_special, parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        """The text of `tokens` as the engine streams it (special tokens not rendered)."""
        return b"".join(self._piece(t) for t in tokens).decode("utf-8", errors="replace")

    def embed(self, inputs: list[list[int]]) -> list:
        """Each input's embedding (numpy float64 vectors, not normalised), between steps (embed.py)."""
        if not inputs or any(not t for t in inputs):
            raise HypuraError("embed needs non-empty token lists")
        if self._kv.n_seq_max <= self.config.parallel:
            raise HypuraError("this engine has no spare sequence for embeddings: load its model with "
                              "spare_seqs=1 (hypura.engine.load does)")
        with self._between_steps():
            if self._stopped or self._closing:
                raise EngineClosed("the engine was closed")
            if self._cells is not None:  # the spare sequence's cells, taken from cached slots where needed
                self._cells.evict(max(map(len, inputs)))
            # every token of an embedding's batch is an output: no more than the context computes (n_outputs_max)
            rows = min(self.step_tokens, self.llm.context_params.n_outputs_max or self.step_tokens)
            return embed(self.llm, self.config.parallel, inputs, rows)

    def fim_tokens(self) -> Optional[tuple[int, int, int]]:
        """The model's fill-in-the-middle tokens (prefix, suffix, middle), None when it lacks one."""
        v = self._vocab.vocab
        tokens = (llama_cpp.llama_vocab_fim_pre(v), llama_cpp.llama_vocab_fim_suf(v), llama_cpp.llama_vocab_fim_mid(v))
        return None if min(tokens) < 0 else tuple(int(t) for t in tokens)

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes as the engine streams them (for logprobs: a token may be part of a character)."""
        return self._piece(token)

    def metrics(self) -> dict:
        with self._cond:  # one snapshot: total = finished + active + queued (active: out of the queue, not finished)
            queued = len(self._waiting)
            active = self._counters.submitted - sum(self._counters.finished.values()) - queued
            out = self._counters.as_dict(active, queued) | {"queue": places(self._waiting, self._preempted)}
            if self._cells is not None:
                out["cells"] = self._cells.as_dict()
        out.update(parallel=self.config.parallel, n_ctx_per_seq=self.n_ctx_per_seq, step_tokens=self.step_tokens,
                   kv_unified=int(self.config.kv_unified))
        if self._spec is not None:  # what speculates (strings: in the JSON, not among /metrics' numbers)
            s = self.config.speculative
            out["speculative"].update(type=s.type, draft=s.draft_model.name if s.draft_model else None)
        with self._between_steps():  # the engine thread updates llm's counters during a step
            out["llm"] = self.llm.stats()
        return out

    @contextlib.contextmanager
    def _between_steps(self):
        """The step lock for another thread. The loop waits at its top while one asks for it: a lock released and
        taken again at once by the same thread is not handed over (POSIX semaphores), so a reader would starve."""
        with self._cond:
            self._lock_waiters += 1
        try:
            self._step_lock.acquire()
        finally:
            with self._cond:
                self._lock_waiters -= 1
                self._cond.notify_all()
        try:
            yield
        finally:
            self._step_lock.release()

    def close(self) -> None:
        """End every request, stop the loop and free the engine's llama.cpp objects (not the model)."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if thread is None:
            self._end_all("engine closed")
            self._free()

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        reason = "engine closed"
        try:
            while True:
                if not self._active:  # no step follows at once (a step delivers right before its decode)
                    self._deliver()
                with self._cond:
                    while not (self._closing or self._waiting or self._active or self._cancelled) or \
                            (self._lock_waiters and not self._closing):
                        self._cond.wait()
                    if self._closing:
                        break
                    cancelled, self._cancelled = self._cancelled, []
                    # by cells, the queue is served under the step lock (_admit_by_cells)
                    n = 0 if self._cells else min(self._slots.free, len(self._waiting))
                    admit = [self._waiting.popleft() for _ in range(n)]
                for request in cancelled:
                    self._end_waiting(request, "cancelled")
                with self._step_lock:
                    self._drop_cancelled()
                    for request in admit:
                        self._admit(request)
                    if self._cells is not None:
                        self._admit_by_cells()
                    if self._active:
                        t0 = time.perf_counter()
                        drafts, draft_s = self._spec.drafts(self._active) if self._spec else ({}, 0.0)
                        if self._spec is not None and self._spec.aside:
                            with self._cond:
                                self._counters.spec.aside_steps += 1
                        self._step(self._plan(drafts), t0, draft_s)
        except BaseException as e:  # a bug: every request learns of it, and submit() refuses new ones
            log.exception("the engine loop failed")
            reason = f"engine failed: {type(e).__name__}: {e}"
        finally:
            with self._cond:
                self._stopped = reason
            self._end_all(reason)
            self._free()

    def _free(self) -> None:
        """The engine's own llama.cpp objects: its batch, and a draft model when it speculates."""
        self._batch.close()
        if self._spec is not None:
            self._spec.close()

    def _end_all(self, reason: str) -> None:
        with self._cond:
            waiting = list(self._waiting) + self._cancelled
            self._waiting.clear()
            self._cancelled = []
        for request in waiting:
            self._end_waiting(request, "cancelled" if request.cancel_requested else "error", reason)
        for seq in list(self._active):
            self._finish(seq, "cancelled" if seq.request.cancel_requested else "error", reason)
        self._deliver()

    def _post(self, request: Request, event: Event) -> None:
        self._outbox.append(functools.partial(request.emit, event))

    def _deliver(self) -> None:
        """Emit the events and results posted since the last delivery, in order (engine thread)."""
        outbox, self._outbox = self._outbox, []
        for emit in outbox:
            emit()

    def _end_waiting(self, request: Request, finish_reason: str, error: Optional[str] = None) -> None:
        seq = self._preempted.pop(request, None)
        if seq is not None:  # preempted: what it generated before is its result
            self._finish(seq, finish_reason, error)
            return
        queued = time.perf_counter() - request.submitted
        self._count_finish(finish_reason)
        result = Result(text="", tokens=(), finish_reason=finish_reason, prompt_tokens=len(request.prompt),
                        cached_tokens=0, queued_s=queued, prompt_s=0.0, decode_s=0.0,
                        error=error if finish_reason == "error" else None)
        self._outbox.append(functools.partial(request.finish, result))

    def _count_finish(self, reason: str) -> None:
        with self._cond:
            self._counters.finished[reason] += 1

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self._active if s.request.cancel_requested]:
            self._finish(seq, "cancelled")

    def _admit(self, request: Request, choice: Optional[Choice] = None) -> None:
        if request.cancel_requested:  # cancelled on its way out of the queue
            self._end_waiting(request, "cancelled")
            return
        seq = self._preempted.pop(request, None)
        feed = request.prompt if seq is None else seq.feed
        choice = choice or self._slots.choose(feed)
        reuse = place(self._kv, self._slots, choice, feed, len(request.prompt))
        if seq is not None:  # preempted before: evaluate its prompt and reply again (admission.py)
            seq.attach(choice.slot, reuse)
            self._active.append(seq)
            with self._cond:
                self._counters.recomputed_tokens += len(feed) - reuse
            return
        sampler = Sampler(request.params, self.n_vocab, self.n_ctx_per_seq, self._vocab.vocab)
        sampler.accept_prompt(request.prompt)
        text = TextStream(self._piece, request.params.stop)
        seq = Sequence(request, choice.slot, reuse, sampler, text, self.n_ctx_per_seq, self._is_eog, self._post)
        self._active.append(seq)
        with self._cond:
            self._counters.prompt_tokens += len(request.prompt)
            self._counters.cached_tokens += reuse

    def _admit_by_cells(self) -> None:
        """kv_unified: the queue's head joins while a slot is free and its cells fit (admission.py)."""
        while True:
            with self._cond:
                if not self._waiting or not self._slots.free:
                    self._cells.blocked = False
                    return
                request = self._waiting[0]
                seq = self._preempted.get(request)
                feed = request.prompt if seq is None else seq.feed
                generated = len(seq.generated) if seq else 0
                left = tokens_left(request.params, self.n_ctx_per_seq, len(request.prompt), generated)
                choice = self._slots.choose(feed)
                if not self._cells.fits(self._active, feed, choice, left, resumed=seq is not None):
                    return
                self._waiting.popleft()
            self._admit(request, choice)

    def _plan(self, drafts: dict) -> Step:
        """The next step; kv_unified: within the cells, the youngest sequences preempted until it fits."""
        if self._cells is None:
            return plan_step(self._active, self.step_tokens, drafts)
        while (step := self._cells.plan(self._active, self.step_tokens, drafts)) is None and len(self._active) > 1:
            self._preempt(self._active[-1])
            drafts = {s: d for s, d in drafts.items() if s in self._active}
        if step is None:  # alone, it fits the whole cache (its limit): nothing cached stays in its way
            self._cells.evict(self._cells.n_cells)
            step = plan_step(self._active, self.step_tokens, drafts)
        return step

    def _preempt(self, seq: Sequence) -> None:
        """`seq` gives its KV back and waits at the queue's front to be recomputed (admission.py)."""
        self._active.remove(seq)
        self._kv.seq_rm(seq.slot)
        self._slots.release(seq.slot, keep=False)
        seq.detach()
        with self._cond:
            self._preempted[seq.request] = seq
            self._waiting.appendleft(seq.request)
            self._counters.preempted += 1
        log.debug("preempted request %d: %d tokens to evaluate again", seq.request.id, len(seq.feed))

    def _step(self, step: Step, t0: float, draft_s: float = 0.0) -> None:
        for chunk in step.chunks:
            chunk.seq.t_scheduled = chunk.seq.t_scheduled or t0
        first = fill(self._batch, step)
        self._deliver()  # the last thing before llama_decode, which releases the GIL to the woken consumers
        t_decode, rc = time.perf_counter(), None
        try:
            rc = self.llm.decode_batch(self._batch, decode=step.decode_only)
            error = None if rc == 0 else f"llama_decode returned {rc} ({DECODE_STATUS.get(rc, 'fatal error')})"
        except Exception as e:  # weights could not be streamed (the decode's results are void)
            error = f"{type(e).__name__}: {e}"
        if rc == 1 and self._cells is not None and len(self._active) > 1:  # no cells after all: make room, again
            self._preempt(self._active[-1])
            return
        if error is not None:
            with self._cond:
                self._counters.failed_steps += 1
            for seq in {c.seq: None for c in step.chunks}:
                self._finish(seq, "error", error)
            return
        decode_s = time.perf_counter() - t_decode
        if self._spec is not None and step.decode_only:
            self._spec.record_step(step.n_tokens, decode_s, draft_s)
        picks = greedy_picks(self._ctx, self.n_vocab, step, first)
        generated, spec = 0, SpecCounters()
        seq_draft_s = draft_s / max(sum(not c.prompt for c in step.chunks), 1)  # drafting time, per sequence
        for chunk, start in zip(step.chunks, first):
            seq = chunk.seq
            if chunk.draft or (self._spec and not chunk.prompt):
                out = self._spec.verify(chunk, start, picks, self._slots, spec, decode_s, seq_draft_s)
                generated += self._emit(seq, out, start)
                continue
            index = start + len(chunk.tokens) - 1
            seq.n_past += len(chunk.tokens)
            self._slots.extend(seq.slot, chunk.tokens)
            seq.next_token = None
            if chunk.sample:
                token = picks.get(index, -1) if picks else -1
                generated += self._emit(seq, [token if token >= 0 else seq.sampler.sample(self._ctx, index)], index)
        with self._cond:
            self._counters.step(time.perf_counter() - t0, step.prompt_tokens, generated)
            if spec.passes:
                s = self._counters.spec
                s.steps, s.passes = s.steps + 1, s.passes + spec.passes
                s.drafted, s.accepted = s.drafted + spec.drafted, s.accepted + spec.accepted
                s.draft_seconds += draft_s

    def _emit(self, seq: Sequence, tokens: list[int], start: int) -> int:
        """Hand `seq` its sampled tokens (the first's logits at batch index `start`) until one ends it."""
        top_n = seq.request.params.logprobs
        for i, token in enumerate(tokens):
            seq.on_token(token, None if top_n is None else token_logprob(self._ctx, start + i, token, top_n))
            if seq.finish_reason is not None:
                self._finish(seq, seq.finish_reason)
                break
        return len(tokens)

    def _finish(self, seq: Sequence, reason: str, error: Optional[str] = None) -> None:
        """End `seq`: a completed one ("stop", "length") leaves its KV cached in the slot, others free it."""
        if seq.slot is not None:  # else preempted, waiting: it holds neither slot nor KV
            self._active.remove(seq)
            keep = reason in ("stop", "length")
            if not keep:
                self._kv.seq_rm(seq.slot)
            self._slots.release(seq.slot, keep)
            if not self._slots.cache and keep:
                self._kv.seq_rm(seq.slot)
        seq.sampler.close()
        result, last = seq.result(reason, error)
        self._count_finish(reason)
        self._outbox.append(functools.partial(seq.request.finish, result, last))

    def _is_eog(self, token: int) -> bool:
        return self._vocab.is_eog(token)

    def _piece(self, token: int) -> bytes:
        """A token's bytes, special tokens not rendered."""
        return self._vocab.piece(token, False)
