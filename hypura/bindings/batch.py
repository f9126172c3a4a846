"""A llama_batch (llama.cpp's decode input: tokens with positions, sequence ids and output flags), owned here
or borrowed, for every front end: one sequence's tokens after its cache (hypura.Llama, hypura-cli, bench) or
a step of many sequences (the engine fills one)."""

from __future__ import annotations

import llama_cpp


class Batch:
    def __init__(self, capacity: int, n_seq_max: int = 1):
        """Room for `capacity` tokens, each of one sequence (a shared prefix is copied, never decoded twice), or
        of up to n_seq_max (a draft tree's node belongs to every branch through it)."""
        self.capacity = capacity
        self.c = llama_cpp.llama_batch_init(capacity, 0, n_seq_max)
        self._owned = True
        for i in range(capacity):
            self.c.n_seq_id[i] = 1

    @classmethod
    def of(cls, tokens: list[int]) -> "Batch":
        """llama_batch_get_one: `tokens` of sequence 0 after those in its cache, logits for the last only."""
        batch = cls.__new__(cls)
        batch._tokens = (llama_cpp.llama_token * len(tokens))(*tokens)  # the batch points into it
        batch.c, batch.capacity, batch._owned = llama_cpp.llama_batch_get_one(batch._tokens, len(tokens)), len(tokens), False
        return batch

    @classmethod
    def view(cls, c) -> "Batch":
        """A llama_batch another owner keeps (llama-cpp-python's)."""
        batch = cls.__new__(cls)
        batch.c, batch.capacity, batch._owned = c, c.n_tokens, False
        return batch

    def set(self, i: int, token: int, pos: int, seq_ids, logits: bool) -> None:
        """Token i of the batch."""
        c = self.c
        c.token[i], c.pos[i], c.logits[i], c.n_seq_id[i] = token, pos, logits, len(seq_ids)
        for j, s in enumerate(seq_ids):
            c.seq_id[i][j] = s

    @property
    def n_tokens(self) -> int:
        return self.c.n_tokens

    def outputs(self) -> int:
        """The tokens whose logits the decode computes (no flags, as llama_batch_get_one leaves them: the last)."""
        c = self.c
        if not c.logits:
            return min(1, c.n_tokens)
        return sum(1 for i in range(c.n_tokens) if c.logits[i])

    def close(self) -> None:
        if self._owned and self.c is not None:
            llama_cpp.llama_batch_free(self.c)
        self.c = None
