"""What one step (one llama_decode) carries, under a token budget:

    [ next token of every decoding sequence, + its draft ][ prompt chunks, oldest request first, while budget lasts ]

Decode tokens go first, so a long prompt never stalls the running sequences: it is evaluated in chunks
over several steps, each taking the budget they leave. Logits are asked for only where a token is
sampled: each decode token, each drafted token (speculate.py), and a prompt's last token (the chunk that
completes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hypura.engine.sequence import Sequence


@dataclass(frozen=True)
class Chunk:
    seq: Sequence
    tokens: list[int]
    pos: int  # position of tokens[0] in the sequence
    sample: bool  # sample from the logits of its last token
    prompt: bool  # a prompt chunk (else a sequence's next generated token)
    draft: tuple[int, ...] = ()  # drafted tokens after the next token (in `tokens`), each verified

    @property
    def outputs(self) -> range:
        """Offsets in `tokens` of the tokens whose logits are asked for."""
        n = len(self.tokens)
        return range(n) if self.draft else range(n - 1, n if self.sample else n - 1)


@dataclass(frozen=True)
class Step:
    chunks: tuple[Chunk, ...]
    t0: float = 0.0  # perf_counter when it was scheduled (its drafts included): a step's time runs from here
    draft_s: float = 0.0  # seconds its drafts took (speculate.py)

    @property
    def n_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    @property
    def decode_only(self) -> bool:
        """Only generated tokens (one per sequence): timed as decode, not prefill."""
        return not any(c.prompt for c in self.chunks)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks if c.prompt)


def plan_step(sequences: list[Sequence], budget: int, drafts: Optional[dict] = None,
              cells: Optional[int] = None) -> Step:
    """`sequences` in admission order; `budget` >= their number plus the drafts' tokens (every decode token
    fits); `drafts`: a decoding sequence's drafted tokens (speculate.py, already cut to the budget); `cells`:
    the KV cells the step may fill (admission.py), which prompt chunks stay within too (None: no bound)."""
    chunks = []
    for s in sequences:
        if s.next_token is not None:
            draft = tuple(drafts.get(s, ())) if drafts else ()
            chunks.append(Chunk(s, [s.next_token, *draft], s.n_past, True, False, draft))
    left = min(budget, budget if cells is None else cells) - sum(len(c.tokens) for c in chunks)
    for s in sequences:
        if left <= 0:
            break
        if s.prefilling:
            n = min(len(s.feed) - s.n_past, left)
            chunks.append(Chunk(s, s.feed[s.n_past: s.n_past + n], s.n_past, s.n_past + n == len(s.feed), True))
            left -= n
    return Step(tuple(chunks))
