"""`hypura.Llama(draft_model=...)`: llama-cpp-python's generate loop, drafting with the length the
cost model picks.

llama-cpp-python's `Llama.generate` already verifies in one pass: it evals the last sampled token and
the draft in one batch (logits at each), samples position by position, and removes the KV cells
after the first mismatch. `SpecDraft` is the draft model it calls: it wraps llama-cpp-python's
drafters (`LlamaPromptLookupDecoding`), Hypura's (`NgramSimple`, `PromptLookup`, `DraftModel`) or a
draft GGUF's path, and between calls reads what the last pass did: the history grew by the tokens it
emitted (accepted drafts plus one), and the target's last decode was the pass.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel

from hypura.speculative.cost import DraftLength, PassTimes
from hypura.speculative.settings import SpecSettings
from hypura.speculative.verify import SpecStats


class SpecDraft(LlamaDraftModel):
    def __new__(cls, drafter, target):
        if cls is SpecDraft and hasattr(drafter, "context_params"):  # a DraftTree: verified as a tree
            from hypura.speculative.llama_tree import TreeSpecDraft

            cls = TreeSpecDraft
        return super().__new__(cls)

    def __init__(self, drafter, target):
        if isinstance(drafter, (str, Path)):
            from hypura.speculative.draft_model import DraftModel

            # the draft's threads are the target's, as llama.cpp's -td/-tbd default to -t/-tb
            drafter = DraftModel.load(drafter, target, n_threads=target.n_threads,
                                      n_threads_batch=target.n_threads_batch)
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
