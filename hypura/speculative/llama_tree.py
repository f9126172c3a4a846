"""`hypura.Llama(draft_model=DraftTree("draft.gguf", branches=4))`: a draft tree verified in one pass
inside llama-cpp-python's generate loop.

That loop evals the last sampled token plus a chain draft, samples position by position from the
context's last outputs (negative indices), and trims the KV cache at the first mismatch. With a tree
the pass is ours: the draft call builds the tree and returns no chain; Llama.eval hands its one token
to `eval_tree`, which decodes the tree in one llama_decode, follows the path the loop's own sampler
will take (a clone of it, same random state, so the same draws; the argmax where the chain holds a
Python sampler that cannot be cloned), keeps that path's KV cells in seq 0, and leaves the loop what a
chain pass would have: the path's tokens in input_ids, their logits as the context's last output rows
(and in scores), n_tokens past them. The loop then samples and accepts them exactly as it would a chain
(a path it does not take is trimmed as a chain's mismatch is).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import llama_cpp
import numpy as np

from hypura.bindings.batch import Batch
from hypura.errors import HypuraError
from hypura.speculative.cost import DraftLength, PassTimes
from hypura.speculative.llama_draft import SpecDraft
from hypura.speculative.tree import context_params, fill_batch, keep_path, open_branches
from hypura.speculative.tree_draft import P_SPLIT, TreeDrafter
from hypura.speculative.verify import SpecStats


@dataclass(frozen=True)
class DraftTree:
    """A draft GGUF (the target's vocabulary) proposing trees of up to `branches` leaves, n_max deep; the
    node budget (up to branches x n_max) follows the passes' cost. p_split: llama.cpp's --spec-draft-p-split;
    pass_ms: {tokens carried: ms} measured beforehand (`hypura bench -p 1,2,4,...`)."""

    model: Union[str, Path]
    branches: int = 4
    n_max: int = 16
    p_split: float = P_SPLIT
    pass_ms: Optional[dict] = None

    def __post_init__(self):
        if not 1 < self.branches <= 64 or self.n_max < 1:
            raise HypuraError(f"a draft tree takes 2 <= branches <= 64 and n_max >= 1 ({self.branches}, {self.n_max})")

    @property
    def context_params(self) -> dict:
        """What the target's llama_context needs: a sequence per branch in one KV cache."""
        return context_params(self.branches)


class TreeSpecDraft(SpecDraft):
    def __init__(self, spec: DraftTree, target):
        n_seq = llama_cpp.llama_n_seq_max(target.ctx)
        if n_seq < spec.branches:
            raise HypuraError(f"a draft tree of {spec.branches} branches needs the target's n_seq_max >= "
                              f"{spec.branches} and kv_unified (param_overrides context_params), not {n_seq}")
        self.target = target
        self.drafter = TreeDrafter.load(spec.model, target, spec.branches, spec.p_split,
                                        n_threads=target.n_threads, n_threads_batch=target.n_threads_batch)
        # a pass is one batch
        self.length = DraftLength(min(spec.branches * spec.n_max, target.n_batch - 1), 0, spec.branches, spec.n_max,
                                  PassTimes.starting(spec.pass_ms, target.plan))
        self.stats = SpecStats()
        self._batch = Batch(self.length.n_max + 1, spec.branches)
        self._pending = None  # (tree, n_past, drafting seconds): drafted, not yet verified

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        n = len(input_ids)
        limit = self.target.n_ctx() - n - 1
        t0 = time.perf_counter()
        depth = min(limit, self.length.depth_max)
        tree = self.drafter.draft_tree(np.asarray(input_ids).tolist(), self.length.choose(limit), depth,
                                       self.length.accept.rates(depth, self.length.width))
        self._pending = (tree, n - 1, time.perf_counter() - t0)
        return np.array([], dtype=np.intc)

    def eval_tree(self, tokens) -> bool:
        """Llama.eval(tokens) as the tree's verification pass; False: not a pass (a plain eval follows)."""
        pending, self._pending = self._pending, None
        t = self.target
        if pending is None or list(tokens) != pending[0].tokens[:1] or t.n_tokens != pending[1]:
            return False
        tree, n_past, draft_s = pending
        ctx = t.ctx
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), -1, n_past, -1)  # as eval does
        sets = tree.seq_sets()
        n_branches = max(s[-1] for s in sets) + 1
        open_branches(ctx, n_branches)
        fill_batch(self._batch, tree, n_past, sets)
        t0 = time.perf_counter()
        rc = t.decode_batch(self._batch, decode=True)
        pass_s = time.perf_counter() - t0
        if rc != 0:
            keep_path(ctx, n_past, sets, [], n_branches)
            raise RuntimeError(f"llama_decode returned {rc}")
        n_vocab = t.n_vocab()
        row = lambda i: np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))  # noqa: E731
        sample, clone = self._sampler(ctx, row)
        _, path, outcomes = tree.walk(sample, 1 << 30, lambda tok: llama_cpp.llama_vocab_is_eog(t._model.vocab, tok))
        if clone is not None:
            clone.close()
        rows = [0] + path
        logits = np.stack([row(i) for i in rows])
        out = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(len(tree.tokens), n_vocab))
        out[len(tree.tokens) - len(rows):] = logits  # the loop samples the last rows: negative indices
        keep_path(ctx, n_past, sets, path, n_branches)
        t.input_ids[n_past: n_past + len(rows)] = [tree.tokens[i] for i in rows]
        if t._logits_all:
            t.scores[n_past: n_past + len(rows), :] = logits
        t.n_tokens = n_past + len(rows)
        t._requires_eval = False
        self.length.record(tree.n_nodes, len(path), pass_s, draft_s, outcomes, max(tree.depth))
        self.stats.add(tree.n_nodes, len(path), pass_s, draft_s)
        return True

    def _sampler(self, ctx, row):
        """(sample(i) as the loop's sampler will sample: a clone of it, else the argmax; the clone to close)."""
        try:
            clone = self.target._sampler.clone()
        except (AttributeError, NotImplementedError):  # no sampler yet, or a Python logits processor in it
            return (lambda i: int(np.argmax(row(i)))), None
        return (lambda i: llama_cpp.llama_sampler_sample(clone.sampler, ctx, i)), clone

    def close(self) -> None:
        self._batch.close()
        self.drafter.close()
