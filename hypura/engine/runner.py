"""Run: a step written into the engine's llama_batch, one llama_decode, its logits read.

Engine thread only, holding the step lock; it owns the batch. The last thing before llama_decode is the
outbox's delivery of the previous step's events (outbox.py): llama_decode releases the GIL to the consumers
they wake. Every decode goes through `LoadedModel.decode_batch` (the Runtime's streaming, timed for stats()).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from hypura.bindings.batch import Batch
from hypura.engine.batch import fill, greedy_picks
from hypura.engine.outbox import Outbox
from hypura.engine.step import Step

DECODE_STATUS = {1: "no free KV cells for the batch", 2: "aborted", -1: "invalid batch"}  # llama.h, llama_decode


@dataclass(frozen=True)
class Ran:
    """What a step's decode gave: each chunk's first batch index, the greedy sequences' tokens by batch index,
    the decode's seconds; or, when it failed, llama_decode's status (None: weights not streamed) and why."""

    first: list[int]
    picks: dict[int, int]
    decode_s: float
    rc: Optional[int] = 0
    error: Optional[str] = None


class Runner:
    def __init__(self, llm, step_tokens: int, outbox: Outbox):
        """llm: the engine's hypura.loaded.LoadedModel; a batch of step_tokens is allocated here."""
        self.llm, self.ctx, self.n_vocab = llm, llm.ctx, llm.vocab.n_tokens
        self.outbox = outbox
        self.batch = Batch(step_tokens)

    def run(self, step: Step) -> Ran:
        first = fill(self.batch, step)
        self.outbox.deliver()  # the last thing before llama_decode, which releases the GIL to the woken consumers
        t_decode, rc = time.perf_counter(), None
        try:
            rc = self.llm.decode_batch(self.batch, decode=step.decode_only)
            error = None if rc == 0 else f"llama_decode returned {rc} ({DECODE_STATUS.get(rc, 'fatal error')})"
        except Exception as e:  # weights could not be streamed (the decode's results are void)
            error = f"{type(e).__name__}: {e}"
        if error is not None:
            return Ran(first, {}, 0.0, rc, error)
        decode_s = time.perf_counter() - t_decode
        return Ran(first, greedy_picks(self.ctx, self.n_vocab, step, first), decode_s)

    def close(self) -> None:
        self.batch.close()
