"""The Engine: one thread that owns the llama.cpp context and runs steps while there is work.

Each step is schedule -> run -> postprocess, each its own part:

    requests in (inbox.py) -> schedule (scheduler.py) -> run (runner.py) -> postprocess (postprocess.py)
                                                                                 -> events out (outbox.py)

Threading protocol:

- Any thread: `submit()` checks the request and queues it, `cancel()` (through the request) marks it and takes
  it out of the queue while it waits, `close()` asks the loop to end; each holds the inbox's lock for
  bookkeeping only and wakes the loop (inbox.py). `tokenize()`, `detokenize()`, `token_bytes()`,
  `fim_tokens()` read the vocabulary only.
- The engine thread (`_run`) waits for work, ends the requests cancelled while they waited, then, holding the
  step lock, runs one step: the scheduler admits waiting requests and says what the step carries, the runner
  decodes it, the postprocessor samples and ends sequences. Every event is emitted from this thread, outside
  every lock: a step's events go out together right before the next step's llama_decode, or before the loop
  sleeps when no step follows (outbox.py).
- A failed llama_decode, or weights that could not be streamed, ends the requests of that step with
  finish_reason "error" (their KV freed); the engine keeps serving the others (postprocess.py).
- `metrics()` and `embed()` take the step lock between steps (Inbox.between_steps): they wait at most one step.
  `close()` ends every request (finish_reason "error", "engine closed") and joins the thread; the model stays
  the caller's, a draft model handed to the engine is the engine's (closed with it).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

import llama_cpp

from hypura.engine.admission import CellAdmission
from hypura.engine.config import EngineConfig
from hypura.engine.embed import embed
from hypura.engine.inbox import Inbox
from hypura.engine.metrics import SpecCounters
from hypura.engine.outbox import Outbox
from hypura.engine.postprocess import Postprocessor
from hypura.engine.prefix_cache import Slots
from hypura.engine.request import Request
from hypura.engine.runner import Runner
from hypura.engine.sampler import check_grammar
from hypura.engine.scheduler import Scheduler
from hypura.engine.sizes import sizes
from hypura.engine.speculate import Speculation
from hypura.engine.types import EngineClosed, Event, PromptTooLong, SamplingParams
from hypura.errors import HypuraError

log = logging.getLogger("hypura.engine")


class Engine:
    def __init__(self, llm, config: EngineConfig = EngineConfig(), draft=None):
        """llm: a hypura.loaded.LoadedModel (hypura.engine.load makes one with the sequences the engine needs);
        draft: the draft model of a draft-simple config.speculative (loader.load_draft), the engine's from here.
        Loads nothing."""
        self.llm, self.config = llm, config
        self._kv, self._vocab = llm.context, llm.vocab
        self.n_vocab = self._vocab.n_tokens
        size = sizes(llm, config)
        self.n_ctx_per_seq, self.step_tokens = size.n_ctx_per_seq, size.step_tokens
        self._inbox, self._outbox = Inbox(config.max_queue), Outbox()
        slots = Slots(config.parallel, size.unified, config.prefix_cache, shared_cells=config.kv_unified)
        self._cells = CellAdmission(self._kv, slots, self._kv.n_ctx()) if config.kv_unified else None
        self._spec: Optional[Speculation] = None
        if config.speculative is not None:
            # the decode part of a step stays one micro-batch: a second one is a second pass over the weights
            self._spec = Speculation(config.speculative, llm, min(self.step_tokens, self._kv.n_ubatch), draft)
            self._inbox.counters.spec = SpecCounters()
        elif draft is not None:
            raise HypuraError("a draft model was given to an engine that does not speculate with one")
        self._scheduler = Scheduler(llm, slots, self._cells, self._spec, self._inbox, self._outbox,
                                    self.n_ctx_per_seq, self.step_tokens)
        self._runner = Runner(llm, self.step_tokens, self._outbox)
        self._postprocessor = Postprocessor(llm, self._scheduler, self._spec, self._inbox)
        self._step_lock = threading.RLock()  # held while the engine thread uses the context (re-entered by on_event)
        self._thread: Optional[threading.Thread] = None
        self._kv.clear()  # sequences start empty: slots own their KV from here

    # --- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        reason = "engine closed"
        try:
            while True:
                if not self._scheduler.active:  # no step follows at once (a step delivers right before its decode)
                    self._outbox.deliver()
                work = self._inbox.next(bool(self._scheduler.active), self._scheduler.free_slots())
                if work is None:  # closing
                    break
                cancelled, admit = work
                for request in cancelled:
                    self._scheduler.end_waiting(request, "cancelled")
                with self._step_lock:
                    step = self._scheduler.schedule(admit)
                    if step is not None:
                        ran = self._runner.run(step)
                        self._postprocessor.postprocess(step, ran)
        except BaseException as e:  # a bug: every request learns of it, and submit() refuses new ones
            log.exception("the engine loop failed")
            reason = f"engine failed: {type(e).__name__}: {e}"
        finally:
            with self._inbox.lock:
                self._inbox.stopped = reason
            self._end(reason)

    def _end(self, reason: str) -> None:
        """Every request ended, their events delivered; the engine's batch and draft model freed."""
        self._scheduler.end_all(reason)
        self._outbox.deliver()
        self._runner.close()
        if self._spec is not None:
            self._spec.close()

    # --- any thread -----------------------------------------------------------------------------
    def start(self) -> "Engine":
        with self._inbox.lock:
            if self._inbox.closing:
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
        request = Request(tokens, params, on_event, self._inbox.cancel)
        self._inbox.put(request)
        return request

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
        with self._inbox.between_steps(self._step_lock):
            if self._inbox.stopped or self._inbox.closing:
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
        with self._inbox.lock:  # one snapshot: total = finished + active + queued
            out = self._inbox.snapshot()
            if self._cells is not None:
                out["cells"] = self._cells.as_dict()
        out.update(parallel=self.config.parallel, n_ctx_per_seq=self.n_ctx_per_seq, step_tokens=self.step_tokens,
                   kv_unified=int(self.config.kv_unified))
        if self._spec is not None:  # what speculates (strings: in the JSON, not among /metrics' numbers)
            s = self.config.speculative
            out["speculative"].update(type=s.type, draft=s.draft_model.name if s.draft_model else None)
        with self._inbox.between_steps(self._step_lock):  # the engine thread updates llm's counters during a step
            out["llm"] = self.llm.stats()
        return out

    def close(self) -> None:
        """End every request, stop the loop and free the engine's llama.cpp objects (not the model)."""
        if not self._inbox.close():
            return
        with self._inbox.lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if thread is None:
            self._end("engine closed")

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _piece(self, token: int) -> bytes:
        """A token's bytes, special tokens not rendered."""
        return self._vocab.piece(token, False)
