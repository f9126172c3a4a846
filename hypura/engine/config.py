"""The engine's settings, read once when an Engine is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from hypura.errors import HypuraError

if TYPE_CHECKING:  # hypura.speculative loads llama.cpp; the engine's types need none
    from hypura.speculative.settings import SpecSettings


@dataclass(frozen=True)
class EngineConfig:
    """How many sequences share a step, how many tokens a step carries, how many requests may wait."""

    parallel: int = 4  # sequences decoded together: llama.cpp sequence ids 0 .. parallel-1 (the slots)
    max_queue: int = 64  # requests waiting for a slot beyond which submit() raises QueueFull
    # tokens one llama_decode carries (every decoding sequence's next token first, then prompt chunks);
    # None: the context's n_batch, the most llama_decode accepts (llama-server's step budget too)
    step_tokens: Optional[int] = None
    # keep a finished sequence's KV in its slot until the slot is needed, and copy the longest common
    # prefix of any slot's KV into a new sequence instead of evaluating it again
    prefix_cache: bool = True
    n_ctx_per_seq: Optional[int] = None  # cap a sequence below what the context gives it (None: no cap)
    # the sequences present share the KV cache's cells (llama-server's --kv-unified): a sequence may hold the
    # whole cache, requests wait for cells and the youngest is preempted and recomputed where they run out
    # (admission.py). Off: each sequence holds n_ctx / parallel, as measured on GPUs so far
    kv_unified: bool = False
    # each decoding sequence drafts tokens verified in the step (speculate.py); None: one token a step
    speculative: Optional[SpecSettings] = None

    def __post_init__(self):
        bad = []
        if self.parallel < 1:
            bad.append(f"parallel {self.parallel} (want >= 1)")
        if self.max_queue < 1:
            bad.append(f"max_queue {self.max_queue} (want >= 1)")
        if self.step_tokens is not None and self.step_tokens < self.parallel:
            bad.append(f"step_tokens {self.step_tokens} (want >= parallel {self.parallel}: every decoding "
                       "sequence's token goes into each step)")
        if self.n_ctx_per_seq is not None and self.n_ctx_per_seq < 2:
            bad.append(f"n_ctx_per_seq {self.n_ctx_per_seq} (want >= 2: a prompt token and a generated one)")
        if self.speculative is not None and self.speculative.tree:
            bad.append(f"speculative tree {self.speculative.tree} (the engine verifies chains: no --spec-tree)")
        if bad:
            raise HypuraError("bad engine settings: " + "; ".join(bad))
