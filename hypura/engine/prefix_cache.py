"""The slots (llama.cpp sequence ids) and the tokens each one's KV cache holds, and the choice of a slot
and a reusable prefix for a new prompt.

A finished sequence's KV stays in its slot (a *cached* slot) until the slot is given to a new request.
A new prompt takes a free slot if there is one, else the least recently used cached slot; its longest
common prefix with any slot's KV (a cached slot's, or a running sequence's evaluated tokens) is then
copied into it with llama_memory_seq_cp instead of being evaluated again. With a unified KV cache such a
copy shares the cells (no bytes move). Without one, llama.cpp copies only whole streams, so a prompt
reuses only the KV already in the slot it takes: the cached slot with the longest common prefix.
Pure bookkeeping: the engine applies the choice to llama.cpp's memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (binary search on C-speed slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class Choice:
    slot: int  # where the new sequence goes
    source: Optional[int]  # the slot whose KV prefix it reuses (== slot: in place); None: nothing reused
    reuse: int  # prompt tokens reused


class Slots:
    def __init__(self, n: int, cross_copy: bool, cache: bool):
        self.kv: list[list[int]] = [[] for _ in range(n)]  # tokens in each slot's KV, positions 0..len-1
        self.active = [False] * n
        self._used = [0] * n  # when each slot was last released (a counter): least recently used goes first
        self._clock = 0
        self.cross_copy, self.cache = cross_copy, cache

    @property
    def free(self) -> int:
        return self.active.count(False)

    def choose(self, prompt: list[int]) -> Optional[Choice]:
        """A slot for `prompt` (None: all are busy) and what of its prefix is reused; at least its last
        token is left to evaluate, for the logits of the first generated token."""
        idle = [s for s, a in enumerate(self.active) if not a]
        if not idle:
            return None
        limit = len(prompt) - 1
        if not self.cache:
            return Choice(idle[0], None, 0)
        sources = range(len(self.kv)) if self.cross_copy else idle
        reuse, source = max(((min(common_prefix(self.kv[s], prompt), limit), s) for s in sources),
                            key=lambda rs: (rs[0], -rs[1]))
        if not self.cross_copy and reuse > 0:
            return Choice(source, source, reuse)  # in place: only the slot's own KV can be kept
        empty = [s for s in idle if not self.kv[s]]
        slot = empty[0] if empty else min(idle, key=lambda s: self._used[s])
        if reuse == 0:
            return Choice(slot, None, 0)
        return Choice(slot, source, reuse)

    def take(self, slot: int, tokens: list[int]) -> None:
        self.active[slot] = True
        self.kv[slot] = list(tokens)

    def release(self, slot: int, keep: bool) -> None:
        """The slot's sequence ended; its KV stays cached when `keep` (and caching is on), else it is gone."""
        self.active[slot] = False
        self._clock += 1
        self._used[slot] = self._clock
        if not (keep and self.cache):
            self.kv[slot] = []
