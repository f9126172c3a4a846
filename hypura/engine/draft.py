"""A draft model for every sequence of the engine at once (`--spec-type draft-simple`, `-md`).

The draft is a small GGUF with the target's vocabulary, loaded resident (every layer offered to the GPU),
with one KV sequence per engine slot in one unified cache. Before a step, each speculating sequence's
history is synced into its draft sequence (the prefix the draft's KV still shares is kept, the rest
removed and decoded: after a pass, only the tokens the target emitted are new), all sequences in one
llama_decode; then the drafts grow one token a round, every sequence still drafting in one llama_decode,
greedily, a sequence stopping at its length or where its top token's probability falls below p_min
(llama.cpp's draft-simple, hypura.speculative.draft_model for one sequence). Engine thread only.
"""

from __future__ import annotations

import logging

import llama_cpp

from hypura.bindings.batch import Batch
from hypura.errors import HypuraError
from hypura.speculative.draft_model import kept_prefix, load_beside, top_token

log = logging.getLogger("hypura.engine")


class BatchedDraft:
    def __init__(self, llm, n_seq: int, p_min: float):
        """llm: the draft model (a hypura.Llama with n_seq_max >= n_seq); closed with this drafter."""
        self.llm, self.p_min = llm, p_min
        self._ctx = llm.ctx
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llm._model.vocab)
        self.cached: list[list[int]] = [[] for _ in range(n_seq)]  # each draft sequence's KV, in order
        self._batch = Batch(llama_cpp.llama_n_batch(self._ctx))

    @classmethod
    def load(cls, path, target, n_seq: int, n_ctx_per_seq: int, p_min: float = 0.0) -> "BatchedDraft":
        """`path` beside `target` (speculative.draft_model.load_beside): a KV sequence for each of n_seq slots."""
        llm = load_beside(path, target, n_ctx=n_seq * n_ctx_per_seq,
                          n_threads=llama_cpp.llama_n_threads(target.ctx),
                          n_threads_batch=llama_cpp.llama_n_threads_batch(target.ctx),
                          parallel=n_seq)
        return cls(llm, n_seq, p_min)

    def draft(self, wants: list[tuple[int, list[int], int]]) -> list[list[int]]:
        """wants: (slot, history ending with the next token, most tokens to draft) per sequence; their drafts."""
        pending, limit = {}, {}
        for slot, history, k in wants:
            if k <= 0:
                continue
            cached = self.cached[slot]
            keep = kept_prefix(cached, history)
            llama_cpp.llama_memory_seq_rm(self._mem, slot, keep, -1)
            del cached[keep:]
            pending[slot], limit[slot] = list(history[keep:]), k
        drafts = {slot: [] for slot in pending}
        while pending:
            try:
                tops = self._decode(pending)
            except HypuraError:  # no drafts this step (the target's step does not need them); start afresh
                log.warning("the draft model's llama_decode failed: drafting again from empty caches")
                llama_cpp.llama_memory_clear(self._mem, True)
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

    def _decode(self, pending: dict[int, list[int]]) -> dict[int, tuple[int, float]]:
        """Decode each slot's tokens after its cache (as many llama_decode as n_batch needs); each slot's
        top token after its last one, with its probability."""
        b, n, tops, ends = self._batch.c, 0, {}, []
        for slot, tokens in pending.items():
            for j, token in enumerate(tokens):
                if n == self._batch.capacity:
                    self._run(n, ends, tops)
                    n, ends = 0, []
                b.token[n], b.pos[n], b.logits[n] = token, len(self.cached[slot]), j == len(tokens) - 1
                b.seq_id[n][0] = slot
                self.cached[slot].append(token)
                if j == len(tokens) - 1:
                    ends.append((slot, n))
                n += 1
        self._run(n, ends, tops)
        return tops

    def _run(self, n: int, ends: list[tuple[int, int]], tops: dict) -> None:
        if n == 0:
            return
        self._batch.c.n_tokens = n
        if self.llm.decode_batch(self._batch, decode=True) != 0:
            raise HypuraError("the draft model's llama_decode failed")
        for slot, i in ends:
            tops[slot] = top_token(self._ctx, i, self.n_vocab, self.p_min)

    def close(self) -> None:
        self._batch.close()
        self.llm.close()
