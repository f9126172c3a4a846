"""The engine's counters since it was made: requests, tokens, and steps timed as llama-batched-bench
reports them (a step with any prompt chunk counts as prefill, one of generated tokens only as decode;
a step's time runs from building its batch to the last sampled token's event)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from hypura.engine.types import FINISH_REASONS


@dataclass
class Phase:
    steps: int = 0
    tokens: int = 0  # prompt tokens evaluated (prefill) / tokens generated (decode)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"steps": self.steps, "tokens": self.tokens, "seconds": self.seconds,
                "tok_s": self.tokens / self.seconds if self.seconds else 0.0}


@dataclass
class SpecCounters:
    """Speculative decoding: a pass is one sequence's draft verified in a step (a step verifies several)."""

    steps: int = 0  # steps that carried a draft
    passes: int = 0
    drafted: int = 0
    accepted: int = 0  # drafted tokens the target's own samples confirmed
    draft_seconds: float = 0.0
    aside_steps: int = 0  # steps of several sequences whose drafts the cost model set aside (speculate.py)

    def as_dict(self) -> dict:
        p = max(self.passes, 1)
        return {"steps": self.steps, "aside_steps": self.aside_steps, "passes": self.passes,
                "drafted_tokens": self.drafted,
                "accepted_tokens": self.accepted, "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
                "accepted_per_pass": self.accepted / p, "tokens_per_pass": (self.accepted + self.passes) / p,
                "draft_seconds": self.draft_seconds}


@dataclass
class Counters:
    submitted: int = 0
    finished: dict = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    prompt_tokens: int = 0  # of finished and running requests' prompts
    cached_tokens: int = 0  # of those, reused from a shared prefix
    generated_tokens: int = 0
    prefill: Phase = field(default_factory=Phase)
    decode: Phase = field(default_factory=Phase)
    failed_steps: int = 0  # llama_decode failed or weights could not be streamed
    preempted: int = 0  # sequences that gave their KV back for others, to be recomputed (admission.py)
    recomputed_tokens: int = 0  # tokens such sequences evaluated again
    spec: Optional[SpecCounters] = None  # with speculative decoding on

    def step(self, seconds: float, prompt_tokens: int, generated: int) -> None:
        phase = self.prefill if prompt_tokens else self.decode
        phase.steps += 1
        phase.seconds += seconds
        phase.tokens += prompt_tokens if prompt_tokens else generated
        self.generated_tokens += generated

    def as_dict(self, active: int, queued: int) -> dict:
        spec = {} if self.spec is None else {"speculative": self.spec.as_dict()}
        return spec | {
            "requests": {"total": self.submitted, "active": active, "queued": queued,
                         "finished": sum(self.finished.values()), "by_reason": dict(self.finished)},
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "steps": self.prefill.steps + self.decode.steps, "failed_steps": self.failed_steps,
            "preempted": self.preempted, "recomputed_tokens": self.recomputed_tokens,
            "prefill": self.prefill.as_dict(), "decode": self.decode.as_dict(),
            "prefill_tok_s": self.prefill.as_dict()["tok_s"], "decode_tok_s": self.decode.as_dict()["tok_s"],
        }


def places(waiting, resumed) -> list[dict]:
    """Each waiting request's place in the queue (0: next), in a list: /metrics labels it by request id."""
    now = time.perf_counter()
    return [{"id": r.id, "position": i, "waited_s": now - r.submitted, "resumed": r in resumed}
            for i, r in enumerate(waiting)]
