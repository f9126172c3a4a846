"""The slots (llama.cpp sequence ids) and the tokens each one's KV cache holds, and the choice of a slot
and a reusable prefix for a new prompt.

A finished sequence's KV stays in its slot (a *cached* slot) until the slot is given to a new request.
A new prompt takes a free slot if there is one, else the least recently used cached slot; its longest
common prefix with any slot's KV (a cached slot's, or a running sequence's evaluated tokens) is then
copied into it with llama_memory_seq_cp instead of being evaluated again. With a unified KV cache such a
copy shares the cells (no bytes move). Without one, llama.cpp copies only whole streams, so a prompt
reuses only the KV already in the slot it takes: the cached slot with the longest common prefix.

With `shared_cells` (EngineConfig.kv_unified), the cells each slot holds are counted (cells.py), and a cached slot is taken in place (its KV cut after the shared
prefix) when it loses nothing worth keeping: all its KV is in the new prompt (a conversation going on), or
its prompt was this prompt (a request made again, whose reply is replaced). Kept beside the new sequence
instead, its cells would stay in the unified cache, and every step attends over all the cells up to the
highest one in use (llama.cpp's n_kv): one SmolLM2-135M client decoded 4-7 % slower beside three cached
slots of 130 tokens each.
Pure bookkeeping: the engine applies the choice to llama.cpp's memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hypura.engine.cells import Cells, Uncounted


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
    def __init__(self, n: int, cross_copy: bool, cache: bool, shared_cells: bool = False):
        self.kv: list[list[int]] = [[] for _ in range(n)]  # tokens in each slot's KV, positions 0..len-1
        # the cells those tokens are in (shared prefixes share them), counted where admission reads them
        self.cells = Cells(n) if shared_cells else Uncounted()
        self.prompt_len = [0] * n  # of each slot's KV, the tokens its request's prompt gave (the rest: its reply)
        self.active = [False] * n
        self._used = [0] * n  # when each slot was last released (a counter): least recently used goes first
        self._clock = 0
        self.cross_copy, self.cache, self.shared_cells = cross_copy, cache, shared_cells

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
        if reuse > 0 and (not self.cross_copy or (self.shared_cells and self._spent(source, prompt))):
            return Choice(source, source, reuse)  # in place (without cross copies only the slot's own KV is kept)
        empty = [s for s in idle if not self.kv[s]]
        slot = empty[0] if empty else min(idle, key=lambda s: self._used[s])
        if reuse == 0:
            return Choice(slot, None, 0)
        return Choice(slot, source, reuse)

    def _spent(self, slot: int, prompt: list[int]) -> bool:
        """An idle slot whose KV is all in `prompt`, or whose own prompt was `prompt`."""
        if self.active[slot]:
            return False
        kv, n = self.kv[slot], self.prompt_len[slot]
        return common_prefix(kv, prompt) == len(kv) or (n == len(prompt) and kv[:n] == prompt)

    def take(self, slot: int, tokens: list[int], prompt_len: Optional[int] = None,
             source: Optional[int] = None) -> None:
        """`slot` runs a request whose prompt has `prompt_len` tokens (default: all of `tokens`), `tokens` of it
        already in the slot's KV: kept in place (source == slot) or shared from `source`'s cells (None: new)."""
        self.active[slot] = True
        self.cells.set_active(slot, True)
        if source == slot:
            self.cells.cut(slot, len(tokens))
        elif source is not None and tokens:
            self.cells.share(slot, source, len(tokens))
        else:
            self.cells.cut(slot, 0)
            self.cells.extend(slot, len(tokens))
        self.kv[slot] = list(tokens)
        self.prompt_len[slot] = len(tokens) if prompt_len is None else prompt_len

    def extend(self, slot: int, tokens: list[int]) -> None:
        """`tokens` evaluated after the slot's KV."""
        self.kv[slot].extend(tokens)
        self.cells.extend(slot, len(tokens))

    def release(self, slot: int, keep: bool) -> None:
        """The slot's sequence ended; its KV stays cached when `keep` (and caching is on), else it is gone."""
        self.active[slot] = False
        self.cells.set_active(slot, False)
        self._clock += 1
        self._used[slot] = self._clock
        if not (keep and self.cache):
            self.evict(slot)

    def evict(self, slot: int) -> None:
        """The slot's KV is gone (llama_memory_seq_rm(slot))."""
        self.kv[slot] = []
        self.cells.cut(slot, 0)

    def cached(self) -> list[int]:
        """Idle slots holding KV, least recently used first."""
        return sorted((s for s, a in enumerate(self.active) if not a and self.kv[s]), key=self._used.__getitem__)
