"""The unified KV cache's cells as llama.cpp holds them, counted without asking it (llama.h has no count).

Each slot's KV is a list of cell ids, one per position 0..len-1. A prefix copied from another slot
(llama_memory_seq_cp in a unified cache) is the same cells, so a cell may belong to several slots; it is
free again once no slot holds it (llama_memory_seq_rm). `used` is what llama.cpp's cache holds; `running`
what the slots of running sequences hold (the rest belongs to cached slots only, freed when one is evicted).
Pure bookkeeping, engine thread only: prefix_cache.Slots keeps it beside each slot's tokens where the
sequences share the cells (EngineConfig.kv_unified), and an Uncounted one otherwise (nothing reads it).
"""

from __future__ import annotations

import collections
import itertools


class Cells:
    def __init__(self, n_slots: int):
        self.ids: list[list[int]] = [[] for _ in range(n_slots)]
        self._refs: collections.Counter = collections.Counter()  # cell -> slots holding it
        self._running: collections.Counter = collections.Counter()  # cell -> running slots holding it
        self._active = [False] * n_slots
        self._fresh = itertools.count()

    @property
    def used(self) -> int:
        return len(self._refs)

    @property
    def running(self) -> int:
        return len(self._running)

    def set_active(self, slot: int, active: bool) -> None:
        if self._active[slot] != active:
            self._active[slot] = active
            (_add if active else _sub)(self._running, self.ids[slot])

    def extend(self, slot: int, n: int) -> None:
        """n new positions at the slot's end, in cells of their own."""
        new = list(itertools.islice(self._fresh, n))
        self.ids[slot].extend(new)
        _add(self._refs, new)
        if self._active[slot]:
            _add(self._running, new)

    def cut(self, slot: int, n: int) -> None:
        """The slot keeps its first n positions (seq_rm(slot, n, -1)); n 0: it holds nothing."""
        gone, self.ids[slot] = self.ids[slot][n:], self.ids[slot][:n]
        _sub(self._refs, gone)
        if self._active[slot]:
            _sub(self._running, gone)

    def share(self, dst: int, src: int, n: int) -> None:
        """dst holds nothing but src's first n cells (seq_rm(dst), then seq_cp(src, dst, 0, n))."""
        self.cut(dst, 0)
        shared = self.ids[src][:n]
        self.ids[dst] = list(shared)
        _add(self._refs, shared)
        if self._active[dst]:
            _add(self._running, shared)


class Uncounted:
    """Cells nothing reads (EngineConfig.kv_unified off): no work a step."""

    used = running = 0

    def set_active(self, slot: int, active: bool) -> None:
        pass

    def extend(self, slot: int, n: int) -> None:
        pass

    def cut(self, slot: int, n: int) -> None:
        pass

    def share(self, dst: int, src: int, n: int) -> None:
        pass


def _add(counter: collections.Counter, cells: list[int]) -> None:
    for c in cells:
        counter[c] += 1


def _sub(counter: collections.Counter, cells: list[int]) -> None:
    for c in cells:
        counter[c] -= 1
        if not counter[c]:
            del counter[c]
