"""Tree verification: a tree of drafted candidates evaluated in one llama_decode of the target.

The protocol of one pass (SpecExec / Sequoia's verification, on llama.cpp's multi-sequence batches):

1. The tree: node 0 is the last sampled token (not yet in the KV cache, position n_past), every other
   node a drafted token at position n_past + its depth, nodes in depth order. Each leaf is a branch
   and gets a sequence id; the branch along the draft's top candidates gets seq 0, the target's own.
2. Before the pass every branch's sequence gets the history: llama_memory_seq_cp(0, s) (in a unified
   KV cache that only adds s to the history's cells). A node is one batch token whose seq_id set is the
   branches through it, so its cell is shared and its attention (the mask is built from a token's
   smallest seq id, whose branch runs through it) sees exactly the history and its ancestors.
3. The target's token is sampled at node 0, then at the child equal to it, and so on: the path ends
   where the sample is no child (or ends generation); that sample is the pass's correction. Greedy
   output is thus the target's argmax chain; sampled output keeps the target's distribution, every
   emitted token being the target's own sample from logits conditioned on exactly the tokens before it.
4. The accepted path's cells are kept in seq 0 (seq_rm of seq 0's deeper cells, or a seq_cp from the
   path's branch when seq 0 left it) and every other branch removed (seq_rm(s, -1, -1)); cells no
   sequence holds are free.

The target's context needs n_seq_max >= the branches and a unified KV cache (`context_params`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from hypura.bindings.batch import Batch
from hypura.errors import HypuraError
from hypura.speculative.draft_length import DraftLength
from hypura.speculative.target import Target
from hypura.speculative.verify import SpecStats

P_SPLIT = 0.1  # llama.cpp's --spec-draft-p-split default


def context_params(branches: int) -> dict:
    """What a target (and a draft model building trees) needs of its llama_context."""
    return {"n_seq_max": max(1, branches), "kv_unified": True}


@dataclass(frozen=True)
class DraftTree:
    """hypura.Llama(draft_model=DraftTree("draft.gguf", branches=4)): a draft GGUF (the target's vocabulary)
    proposing trees of up to `branches` leaves, n_max deep; the node budget (up to branches x n_max) follows the
    passes' cost. p_split: llama.cpp's --spec-draft-p-split; pass_ms: {tokens carried: ms} measured beforehand
    (`hypura bench -p 1,2,4,...`)."""

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


@dataclass
class Tree:
    """Node 0 the root; parent[i] < i, depth non-decreasing; rank: 1 for the draft's top candidate among
    siblings, 2 for the next, ..."""

    tokens: list[int]
    parent: list[int] = field(default_factory=lambda: [-1])
    depth: list[int] = field(default_factory=lambda: [0])
    rank: list[int] = field(default_factory=lambda: [0])

    def add(self, token: int, parent: int, rank: int) -> int:
        self.tokens.append(token)
        self.parent.append(parent)
        self.depth.append(self.depth[parent] + 1)
        self.rank.append(rank)
        return len(self.tokens) - 1

    @property
    def n_nodes(self) -> int:
        """Drafted nodes (the root is not drafted)."""
        return len(self.tokens) - 1

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.tokens]
        for i in range(1, len(self.tokens)):
            out[self.parent[i]].append(i)
        return out

    def seq_sets(self) -> list[list[int]]:
        """Each node's branches (sequence ids); the leaf reached by following rank-1 children is seq 0."""
        kids = self.children()
        leaves = [i for i in range(len(self.tokens)) if not kids[i]]
        top = 0
        while kids[top]:
            top = min(kids[top], key=lambda c: self.rank[c])
        leaves.sort(key=lambda i: i != top)
        sets: list[list[int]] = [[] for _ in self.tokens]
        for s, leaf in enumerate(leaves):
            i = leaf
            while i >= 0:
                sets[i].append(s)
                i = self.parent[i]
        return [sorted(x) for x in sets]

    def walk(self, sample: Callable[[int], int], limit: int, is_eog: Callable[[int], bool]):
        """Follow the target's samples from the root: (emitted tokens, path nodes, (depth, rank, hit) outcomes)."""
        kids = self.children()
        out, path, outcomes, node = [], [], [], 0
        while True:
            tok = sample(node)
            out.append(tok)
            nxt = None
            for c in kids[node]:
                outcomes.append((self.depth[c], self.rank[c], self.tokens[c] == tok))
                if self.tokens[c] == tok:
                    nxt = c
            if nxt is None or len(out) >= limit or is_eog(tok):
                return out, path, outcomes
            path.append(nxt)
            node = nxt


def fill_batch(batch: Batch, tree: Tree, n_past: int, sets: list[list[int]]) -> None:
    for i, tok in enumerate(tree.tokens):
        batch.set(i, tok, n_past + tree.depth[i], sets[i], True)
    batch.c.n_tokens = len(tree.tokens)


def open_branches(target: Target, n_branches: int) -> None:
    """Every branch's sequence holds the history (seq 0's cells)."""
    for s in range(1, n_branches):
        target.seq_rm(s)
        target.seq_cp(0, s)


def keep_path(target: Target, n_past: int, sets: list[list[int]], path: Sequence[int], n_branches: int) -> None:
    """Seq 0 holds the history, the root and the accepted path's nodes (at n_past + 1 ...); nothing else
    of the tree stays."""
    end = n_past + 1 + len(path)
    last = path[-1] if path else 0
    if 0 in sets[last]:
        target.seq_rm(0, end, -1)
    else:
        target.seq_rm(0, n_past + 1, -1)
        target.seq_cp(sets[last][0], 0, n_past + 1, end)
    for s in range(1, n_branches):
        target.seq_rm(s)


class TreeVerifier:
    """The Verifier's step for a tree: one sequence, seq 0 of a target whose context has n_seq_max >= branches
    and a unified KV cache."""

    def __init__(self, target: Target, drafter, length: DraftLength, is_eog: Callable[[int], bool]):
        """drafter: a TreeDrafter (hypura.speculative.tree_draft); length: its node budget's cost model."""
        self.target, self.drafter, self.length, self.is_eog = target, drafter, length, is_eog
        self.stats = SpecStats()
        n_seq = target.n_seq_max
        if n_seq < drafter.branches:
            raise HypuraError(f"a tree of {drafter.branches} branches needs n_seq_max >= {drafter.branches} ({n_seq})")
        length.n_max = min(length.n_max, target.n_batch - 1)  # a pass is one batch
        self._batch = Batch(length.n_max + 1, drafter.branches)

    def step(self, history: Sequence[int], n_past: int, sample: Callable[[int], int],
             limit: int) -> Optional[list[int]]:
        """As Verifier.step: history holds the KV cache's tokens then the last sampled token; sample(i) is
        the target's token from the batch's i-th logits; at most `limit` tokens are emitted."""
        n = self.length.choose(limit - 1)
        t0 = time.perf_counter()
        depth = min(limit - 1, self.length.depth_max or n)
        tree = self.drafter.draft_tree(history, n, depth, self.length.accept.rates(depth, self.length.width))
        done = self.verify(tree, n_past, sample, limit, time.perf_counter() - t0)
        return None if done is None else done[0]

    def verify(self, tree: Tree, n_past: int, sample: Callable[[int], int], limit: int,
               draft_s: float) -> Optional[tuple[list[int], list[int]]]:
        """One pass over a drafted `tree` whose root is decoded at n_past: (the emitted tokens, the accepted path's
        nodes), the KV cache holding the root and the path in seq 0 and the batch's logits still readable; None
        when llama_decode failed (nothing of the tree stays). draft_s: what drafting the tree took."""
        sets = tree.seq_sets()
        n_branches = max(s[-1] for s in sets) + 1
        open_branches(self.target, n_branches)
        fill_batch(self._batch, tree, n_past, sets)
        t0 = time.perf_counter()
        if self.target.decode(self._batch, True) != 0:
            keep_path(self.target, n_past, sets, [], n_branches)
            return None
        pass_s = time.perf_counter() - t0
        out, path, outcomes = tree.walk(sample, limit, self.is_eog)
        keep_path(self.target, n_past, sets, path, n_branches)
        self.length.record(tree.n_nodes, len(path), pass_s, draft_s, outcomes, max(tree.depth))
        self.stats.add(tree.n_nodes, len(path), pass_s, draft_s)
        return out, path

    def close(self) -> None:
        self._batch.close()
        self.drafter.close()
