"""`hypura.Llama(draft_model=...)`: speculation inside llama-cpp-python's generate loop, the adapters beside
`Llama` over hypura.speculative's drafters, cost model and tree verification.

llama-cpp-python's `Llama.generate` already verifies in one pass: it evals the last sampled token and the draft in
one batch (logits at each), samples position by position, and removes the KV cells after the first mismatch.
`SpecDraft` is the draft model it calls: it wraps llama-cpp-python's drafters (`LlamaPromptLookupDecoding`),
Hypura's (`NgramSimple`, `PromptLookup`, a DraftModel) or a draft GGUF's path, and between calls reads what the
last pass did: the history grew by the tokens it emitted (accepted drafts plus one), and the target's last decode
was the pass; the draft length follows the cost model (hypura.speculative.draft_length).

With a `DraftTree` the pass is ours (`TreeSpecDraft`): the draft call builds the tree and returns no chain;
Llama.eval hands its one token to `eval_tree`, which decodes the tree in one llama_decode, follows the path the
loop's own sampler will take (a clone of it, same random state, so the same draws; the argmax where the chain
holds a Python sampler that cannot be cloned), keeps that path's KV cells in seq 0, and returns the path's tokens
and logits: Llama.eval leaves the loop what a chain pass would have, and the loop samples and accepts them exactly
as it would a chain (a path it does not take is trimmed as a chain's mismatch is).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import llama_cpp
import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel

from hypura.errors import HypuraError
from hypura.loaded.drafts import draft_model, tree_drafter
from hypura.speculative.draft_length import DraftLength, PassTimes
from hypura.speculative.settings import SpecSettings
from hypura.speculative.tree import TreeVerifier
from hypura.speculative.verify import SpecStats


class SpecDraft(LlamaDraftModel):
    def __new__(cls, drafter, target):
        if cls is SpecDraft and hasattr(drafter, "context_params"):  # a DraftTree: verified as a tree
            cls = TreeSpecDraft
        return super().__new__(cls)

    def __init__(self, drafter, target):
        """target: the hypura.Llama whose generate loop calls this."""
        if isinstance(drafter, (str, Path)):
            # the draft's threads are the target's, as llama.cpp's -td/-tbd default to -t/-tb
            drafter = draft_model(drafter, target, n_threads=target.n_threads, n_threads_batch=target.n_threads_batch)
        self.drafter, self.target = drafter, target
        # the longest draft: the drafter's own (LlamaPromptLookupDecoding's num_pred_tokens), else --spec-draft-n-max's
        n_max = getattr(drafter, "num_pred_tokens", None) or SpecSettings.n_max
        self.length = DraftLength(n_max, times=PassTimes.starting(None, target.plan))
        self.stats = SpecStats()
        self._last: tuple[int, int, float] | None = None  # (history length, draft length, drafting s)

    def _propose(self, history: np.ndarray, k: int) -> np.ndarray:
        if hasattr(self.drafter, "draft"):  # Hypura's drafters take the length
            return np.asarray(self.drafter.draft(history.tolist(), k), dtype=np.intc)
        return np.asarray(self.drafter(history), dtype=np.intc)[:k]

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        n = len(input_ids)
        if self._last is not None:
            n_prev, n_draft, draft_s = self._last
            emitted = n - n_prev
            if 1 <= emitted <= n_draft + 1:  # else a new generation began
                pass_s = self.target.last_decode_seconds
                self.length.record(n_draft, emitted - 1, pass_s, draft_s)
                self.stats.add(n_draft, emitted - 1, pass_s, draft_s)
        k = self.length.choose(self.target.n_ctx() - n - 1)
        t0 = time.perf_counter()
        draft = self._propose(np.asarray(input_ids, dtype=np.intc), k) if k > 0 else np.array([], dtype=np.intc)
        self._last = (n, len(draft), time.perf_counter() - t0)
        return draft

    def reset_stats(self) -> None:
        self.stats = SpecStats()

    def close(self) -> None:
        close = getattr(self.drafter, "close", None)
        if close is not None:
            close()


class TreeSpecDraft(SpecDraft):
    def __init__(self, spec, target):
        """spec: a hypura.speculative.DraftTree; target: the hypura.Llama."""
        kv = target.loaded.context
        if kv.n_seq_max < spec.branches:
            raise HypuraError(f"a draft tree of {spec.branches} branches needs the target's n_seq_max >= "
                              f"{spec.branches} and kv_unified (param_overrides context_params), not {kv.n_seq_max}")
        self.target, self.kv = target, kv
        drafter = tree_drafter(spec.model, target, spec.branches, spec.p_split,
                               n_threads=target.n_threads, n_threads_batch=target.n_threads_batch)
        length = DraftLength(spec.branches * spec.n_max, 0, spec.branches, spec.n_max,
                             PassTimes.starting(spec.pass_ms, target.plan))
        self.verifier = TreeVerifier(kv, drafter, length, target.vocab.is_eog)  # a pass: one batch of the target's
        self.drafter, self.length = drafter, self.verifier.length
        self._pending = None  # (tree, n_past, drafting seconds): drafted, not yet verified

    @property
    def stats(self) -> SpecStats:
        return self.verifier.stats

    def reset_stats(self) -> None:
        self.verifier.stats = SpecStats()

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        n = len(input_ids)
        limit = self.target.n_ctx() - n - 1
        t0 = time.perf_counter()
        depth = min(limit, self.length.depth_max)
        tree = self.drafter.draft_tree(np.asarray(input_ids).tolist(), self.length.choose(limit), depth,
                                       self.length.accept.rates(depth, self.length.width))
        self._pending = (tree, n - 1, time.perf_counter() - t0)
        return np.array([], dtype=np.intc)

    def eval_tree(self, tokens, n_tokens: int, sampler) -> Optional[tuple[list[int], np.ndarray]]:
        """Llama.eval(tokens) at n_tokens as the tree's verification pass (TreeVerifier.verify): the accepted
        path's tokens (the root first) and their logits rows, the KV cache holding them in seq 0, and the
        context's last output rows theirs; None: not a pass (a plain eval follows). sampler: the loop's
        llama-cpp-python sampler (None before its first sample)."""
        pending, self._pending = self._pending, None
        if pending is None or list(tokens) != pending[0].tokens[:1] or n_tokens != pending[1]:
            return None
        tree, n_past, draft_s = pending
        self.kv.seq_rm(-1, n_past, -1)  # as eval does
        sample, clone = self._sampler(sampler)
        try:
            done = self.verifier.verify(tree, n_past, sample, 1 << 30, draft_s)
        finally:
            if clone is not None:
                clone.close()
        if done is None:
            raise RuntimeError("llama_decode failed on the tree's verification pass")
        rows = [0] + done[1]
        logits = np.stack([self.kv.logits(i) for i in rows])
        out = self.kv.output_rows(len(tree.tokens))
        out[len(tree.tokens) - len(rows):] = logits  # the loop samples the last rows: negative indices
        return [tree.tokens[i] for i in rows], logits

    def _sampler(self, sampler):
        """(sample(i) as the loop's sampler will sample: a clone of it, else the argmax; the clone to close)."""
        try:
            clone = sampler.clone()
        except (AttributeError, NotImplementedError):  # no sampler yet, or a Python logits processor in it
            return (lambda i: int(np.argmax(self.kv.logits(i)))), None
        return (lambda i: llama_cpp.llama_sampler_sample(clone.sampler, self.kv.ctx, i)), clone

    def close(self) -> None:
        self.verifier.close()
