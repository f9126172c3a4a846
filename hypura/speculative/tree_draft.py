"""A draft model proposing a tree of candidates (SpecExec's search, level by level).

Each node scores the product along its path of its acceptance estimates: the cost model's measured rate
for its (depth, rank) when given (the draft's probabilities are not the acceptance of greedy verification:
a model drafting for itself has every top candidate accepted, however unsure it is), else the draft's
probability (SpecExec's); ties go to the draft's probabilities. Level d's candidates are the
top children of the level's expanded nodes by draft probability (the top one always; the others only
above p_split, llama.cpp's --spec-draft-p-split). The tree sent to the target is the n best-scoring
candidates with at most `branches` leaves; a candidate is expanded (decoded by the draft, to score its
children) only while it is among the n best so far, at most `branches` a level, so drafting costs one
draft decode per level and stops once no deeper node can enter the n best.

The draft's KV cache holds the tree as llama.cpp's speculative example holds its branches: one sequence
per open branch (a node's best expanded child keeps its sequence, the others get a copy of it), so seq 0
follows the draft's top candidates; afterwards only seq 0 stays, and the next call keeps what of it the
target accepted.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from hypura.bindings.batch import Batch
from hypura.errors import HypuraError
from hypura.speculative.draft_model import DraftModel
from hypura.speculative.tree import P_SPLIT, Tree



class TreeDrafter:
    name = "draft-tree"

    def __init__(self, draft: DraftModel, branches: int, p_split: float = P_SPLIT):
        self.draft, self.branches, self.p_split = draft, branches, p_split
        n_seq = draft.target.n_seq_max
        if n_seq < branches:
            raise HypuraError(f"the draft model's context has n_seq_max {n_seq}; a tree of {branches} branches "
                             f"needs {branches}")
        self._batch = Batch(branches, 1)

    def _top(self, i: int) -> list[tuple[int, float]]:
        """The draft's top `branches` tokens and probabilities at its last decode's output i."""
        d = self.draft
        logits = d.target.logits(i)
        k = min(self.branches, d.n_vocab)
        top = np.argpartition(logits, -k)[-k:]
        top = top[np.argsort(-logits[top])]
        z = np.exp(logits - logits[top[0]])
        return [(int(t), float(p)) for t, p in zip(top, z[top] / z.sum())]

    def draft_tree(self, history, n_nodes: int, depth_max: int, rates: Optional[dict] = None) -> Tree:
        """A tree of at most n_nodes drafted tokens after history (whose last token is the root), depth
        at most depth_max; rates: {(depth, rank): acceptance} (hypura.speculative.draft_length.Acceptance.rates)."""
        d = self.draft
        if n_nodes <= 0 or depth_max <= 0 or not history:
            return Tree([history[-1]])
        d.decode({0: d.forget_after(0, history)}, lambda i: None)  # the root's logits: the last output
        n_past = len(history) - 1
        tok, parent, depth, rank, score, qs = [history[-1]], [-1], [0], [0], [1.0], [1.0]
        seq = {0: 0}  # expanded candidate -> its draft sequence
        chain0: list[int] = []  # seq 0's decoded nodes: the draft's cache after this call
        frontier = [(0, -1)]  # (candidate, its logits' output index)
        for level in range(1, depth_max + 1):
            new = []
            for c, out in frontier:
                for r, (t, q) in enumerate(self._top(out), 1):
                    if r > 1 and q <= self.p_split:
                        break
                    tok.append(t), parent.append(c), depth.append(level), rank.append(r), qs.append(qs[c] * q)
                    score.append(score[c] * (rates.get((level, r), q) if rates else q))
                    new.append(len(tok) - 1)
            if level == depth_max or not new:
                break
            best = sorted(score[1:], reverse=True)
            bar = best[n_nodes - 1] if len(best) >= n_nodes else 0.0
            expand = sorted((i for i in new if score[i] >= bar and score[i] > 0.0),
                            key=lambda i: (-score[i], -qs[i]))[:self.branches]
            if not expand:
                break
            inherited = {}
            for i in expand:
                inherited.setdefault(parent[i], i)
            free = sorted(set(range(self.branches)) - {seq[p] for p in inherited})
            b = self._batch
            for j, i in enumerate(expand):
                if inherited[parent[i]] == i:
                    seq[i] = seq[parent[i]]
                else:
                    seq[i] = free.pop(0)
                    d.target.seq_rm(seq[i])
                    d.target.seq_cp(seq[parent[i]], seq[i])
                b.set(j, tok[i], n_past + level, [seq[i]], True)
            b.c.n_tokens = len(expand)
            if d.target.decode(b) != 0:
                break
            chain0 += [tok[i] for i in expand if seq[i] == 0]
            frontier = [(i, j) for j, i in enumerate(expand)]
        for s in range(1, self.branches):
            d.target.seq_rm(s)
        d.cached[0] = list(history) + chain0
        return _select(tok, parent, depth, rank, score, n_nodes, self.branches, qs)

    def close(self) -> None:
        self._batch.close()
        self.draft.close()


def _select(tok, parent, depth, rank, score, n_nodes: int, branches: int, qs=None) -> Tree:
    """The best-scoring candidates (ties: the likelier to the draft) as a tree of at most n_nodes nodes and
    `branches` leaves, in depth order."""
    qs = qs or score
    order = sorted(range(1, len(tok)), key=lambda i: (-score[i], -qs[i], depth[i]))
    kept, n_kids, leaves = {0}, {0: 0}, 1
    for i in order:
        if len(kept) > n_nodes:
            break
        p = parent[i]
        if p not in kept:
            continue
        grows = n_kids[p] > 0  # a second child opens a branch
        if grows and leaves >= branches:
            continue
        kept.add(i)
        n_kids[p] += 1
        n_kids[i] = 0
        leaves += grows
    tree, index = Tree([tok[0]]), {0: 0}
    for i in sorted(kept - {0}, key=lambda i: (depth[i], -score[i])):
        index[i] = tree.add(tok[i], index[parent[i]], rank[i])
    return tree
