"""A draft model: a small GGUF with the target's vocabulary, resident beside the target, drafting for one
sequence (hypura-cli, hypura.Llama, bench) or for every sequence of the engine at once.

It keeps a KV sequence per target sequence ("slot") in its own cache. Before drafting, each slot's history is
synced into its sequence: the prefix the draft's cache still shares is kept (rejected drafts are removed), the
rest decoded, every slot in one llama_decode (as many as n_batch needs). Then the drafts grow one token a round,
every slot still drafting in one llama_decode, greedily, a slot stopping at its length or where its top token's
probability falls below p_min (llama.cpp's draft-simple). hypura.loaded.drafts loads one beside a target.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import llama_cpp
import numpy as np

from hypura.bindings.batch import Batch
from hypura.errors import HypuraError
from hypura.speculative.target import Target

log = logging.getLogger("hypura.speculative")


class DraftModel:
    name = "draft"

    def __init__(self, target: Target, n_seq: int = 1, p_min: float = 0.0, model=None):
        """target: the draft model's context (n_seq_max >= n_seq); its KV cache is this drafter's alone. model: what
        holds it (a hypura.loaded.LoadedModel), closed with this drafter."""
        self.target, self.p_min, self.model = target, p_min, model
        self.n_vocab = target.n_vocab
        self.cached: list[list[int]] = [[] for _ in range(n_seq)]  # each slot's tokens in the draft's KV, in order
        self._batch = Batch(target.n_batch)

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        """One sequence's draft (slot 0): at most n_max tokens after `history` (its last token the next)."""
        return self.draft_many([(0, list(history), n_max)])[0]

    def draft_many(self, wants: list[tuple[int, list[int], int]]) -> list[list[int]]:
        """wants: (slot, history ending with the next token, most tokens to draft) per sequence; their drafts.
        A failed draft decode drafts nothing this time (the target's pass does not need drafts) and starts the
        caches afresh."""
        pending, limit = {}, {}
        for slot, history, k in wants:
            if k <= 0 or not history:
                continue
            pending[slot], limit[slot] = self.forget_after(slot, history), k
        drafts: dict[int, list[int]] = {slot: [] for slot in pending}
        while pending:
            try:
                tops = self.decode(pending, lambda i: top_token(self.target.logits(i), self.p_min))
            except HypuraError:
                log.warning("the draft model's llama_decode failed: drafting again from empty caches")
                self.target.seq_rm(-1)
                self.cached = [[] for _ in self.cached]
                return [[] for _ in wants]
            pending = {}
            for slot, (token, p) in tops.items():
                if p < self.p_min:
                    continue
                drafts[slot].append(token)
                if len(drafts[slot]) < limit[slot]:
                    pending[slot] = [token]
        return [drafts.get(slot, []) for slot, _, _ in wants]

    def forget_after(self, slot: int, history: Sequence[int]) -> list[int]:
        """Keep what of the slot's cache `history` still shares (kept_prefix); the tokens left to decode."""
        cached = self.cached[slot]
        keep = kept_prefix(cached, history)
        self.target.seq_rm(slot, keep, -1)
        del cached[keep:]
        return list(history[keep:])

    def decode(self, pending: dict[int, list[int]], read: Callable[[int], object]) -> dict[int, object]:
        """Decode each slot's tokens after its cache (as many llama_decode as n_batch needs); read(output index)
        after each slot's last token."""
        b, n, out, ends = self._batch, 0, {}, []
        for slot, tokens in pending.items():
            for j, token in enumerate(tokens):
                if n == b.capacity:
                    self._run(n, ends, read, out)
                    n, ends = 0, []
                last = j == len(tokens) - 1
                b.set(n, token, len(self.cached[slot]), (slot,), last)
                self.cached[slot].append(token)
                if last:
                    ends.append((slot, n))
                n += 1
        self._run(n, ends, read, out)
        return out

    def _run(self, n: int, ends: list[tuple[int, int]], read: Callable, out: dict) -> None:
        if n == 0:
            return
        self._batch.c.n_tokens = n
        if self.target.decode(self._batch, True) != 0:
            raise HypuraError("the draft model's llama_decode failed")
        for slot, i in ends:
            out[slot] = read(i)

    def close(self) -> None:
        self._batch.close()
        if self.model is not None:
            self.model.close()


def kept_prefix(cached: Sequence[int], history: Sequence[int]) -> int:
    """How much of a draft's KV (`cached`) serves `history`: the prefix they share, less history's last token,
    which is decoded again (its logits are needed)."""
    return min(llama_cpp.Llama.longest_token_prefix(cached, history), len(history) - 1)


def top_token(logits: np.ndarray, p_min: float) -> tuple[int, float]:
    """The greedy token of a logits row and its probability (1.0 when no p_min asks for it)."""
    tok = int(np.argmax(logits))
    return tok, 1.0 if p_min <= 0.0 else float(1.0 / np.exp(logits - logits[tok]).sum())
