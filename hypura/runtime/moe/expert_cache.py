"""Expert caches and their policies, counted as docs/design.md defines the metrics.

A cache holds whole experts of one layer (the unit the runtime loads: one expert's slice of each
stacked `ffn_*_exps` tensor). An access is one (token, layer, selected expert), counted once per
access (not per graph node); a miss takes the slot of the policy's victim. Prefetched experts are
marked until used or evicted: used (late where compute still waited for the load), or wasted.

Policies score resident experts; the lowest score is evicted:
  lru    time of the last access
  lfu    number of accesses
  decay  frequency with exponential decay (half-life in accesses of the layer): recent popularity
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from hypura.errors import HypuraError
from hypura.runtime.mechanism import TierStats
from hypura.tiers.names import RAM

POLICIES = ("lru", "lfu", "decay")
# the best hit rate on routing traces of tiny-qwen3moe, 6 of 16 experts cached (tests/test_expert_cache.py):
# decay 0.60 / 0.49, LFU 0.57 / 0.45, LRU 0.56 / 0.47 for skewed / unskewed routers
DEFAULT_POLICY = "decay"
DECAY_HALF_LIFE = 64  # accesses of a layer after which an old access counts half


@dataclass
class LayerCache:
    capacity: int
    policy: str = DEFAULT_POLICY
    resident: dict = field(default_factory=dict)  # expert -> score
    prefetched: set = field(default_factory=set)  # resident, brought by prefetch, not used yet
    clock: int = 0
    base: int = 0  # decay: scores are in units of 2^(base / half-life)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"unknown cache policy {self.policy!r}; known: {', '.join(POLICIES)}")

    def touch(self, expert: int) -> None:
        self.clock += 1
        if self.policy == "lru":
            self.resident[expert] = float(self.clock)
        elif self.policy == "lfu":
            self.resident[expert] = self.resident.get(expert, 0.0) + 1.0
        else:
            # an access at time t weighs 2^(t / half-life): every score then decays alike, so the order
            # equals that of frequencies decayed to now, at O(1) a touch (the router hook's hot path)
            age = (self.clock - self.base) / DECAY_HALF_LIFE
            if age > 512:  # rescale before the weights overflow
                for e in self.resident:
                    self.resident[e] *= 2.0 ** -age
                self.base, age = self.clock, 0.0
            self.resident[expert] = self.resident.get(expert, 0.0) + 2.0 ** age

    def insert(self, expert: int, pinned: set) -> bool:
        """Make room (never evicting `pinned`: experts the current token needs) and add `expert`."""
        if expert in self.resident:
            return True
        if self.capacity <= 0:
            return False
        if len(self.resident) >= self.capacity:
            candidates = [e for e in self.resident if e not in pinned]
            if not candidates:
                return False
            victim = min(candidates, key=lambda e: (self.resident[e], e))
            del self.resident[victim]
            self.prefetched.discard(victim)
        self.resident[expert] = 0.0 if self.policy != "lru" else float(self.clock)
        return True


class ExpertSlots:
    """One MoE layer's expert cache as the runtime keeps it (expert_streaming.py): the slot each cached
    expert's bytes are in or loading into (`slot_of`), the policy's scores (`cache`), the loads not yet
    published to the C side; and the counting of a batch's accesses into the runtime's TierStats
    (`tier`: where hits are served). No C here: `evicted` is where the C side learns of a victim."""

    def __init__(self, layer: int, n_slots: int, policy: str):
        self.layer = layer
        self.cache = LayerCache(n_slots, policy)
        self.slot_of: dict[int, int] = {}
        self.unpublished: list[tuple[int, int]] = []  # (expert, slot) loaded or loading, not published yet
        self.free = list(range(n_slots - 1, -1, -1))

    def evicted(self, expert: int) -> None:
        """`expert` lost its slot, whose bytes are about to be overwritten."""

    def take_slot(self, expert: int, pinned: set, stats: Optional[TierStats] = None) -> Optional[int]:
        """A slot for `expert` (evicting the policy's victim outside `pinned`), None if none can be had; a victim
        that a prefetch brought and nothing used counts as a wasted prefetch in `stats`."""
        before, unused = set(self.cache.resident), set(self.cache.prefetched)
        if not self.cache.insert(expert, pinned):
            return None
        gone = before - set(self.cache.resident)
        if gone:
            victim = gone.pop()
            if stats is not None and victim in unused:
                stats.prefetch_wasted += 1
            self.evicted(victim)
            slot = self.slot_of.pop(victim)
        else:
            slot = self.free.pop()
        self.slot_of[expert] = slot
        self.unpublished.append((expert, slot))
        return slot

    def account(self, rows: list, stats: TierStats, tier: str, late: bool = False) -> Counter:
        """Count a batch's accesses (one per token and selected expert): hits or loads from RAM. late: the
        layer's prefetches were still loading when the batch came (compute waited for them)."""
        uses = Counter(e for row in rows for e in row)
        stats.accesses += sum(map(len, rows))
        for e, count in uses.items():
            if e in self.slot_of:
                stats.hits[tier] += count
                if e in self.cache.prefetched:
                    self.cache.prefetched.discard(e)
                    stats.prefetch_used += 1
                    stats.prefetch_late += late
            else:
                stats.hits[RAM] += count
        return uses

    def access(self, rows: list, stats: TierStats, tier: str, late: bool = False) -> list[tuple[int, int]]:
        """A batch's selected experts ([n_tokens][k]): counted (late: as account's), the misses given slots
        (never one this batch needs), all touched; returns the (expert, slot) loads to make now."""
        uses = self.account(rows, stats, tier, late)
        demand = []
        for e in uses:
            if e not in self.slot_of:
                slot = self.take_slot(e, set(uses), stats)
                if slot is None:
                    raise HypuraError(f"layer {self.layer}: no slot left for expert {e} ({len(uses)} needed at once)")
                demand.append((e, slot))
            self.cache.touch(e)
        return demand

    def replay(self, rows: list, stats: TierStats, tier: str) -> None:
        """A batch the C side answered from ready slots: all hits, counted and touched as access() does."""
        for e in self.account(rows, stats, tier):
            self.cache.touch(e)

    def prefetch(self, guess: list[int], stats: TierStats) -> list[tuple[int, int]]:
        """Slots for the predicted experts not cached yet, marked prefetched; returns the loads to make."""
        todo = []
        for e in guess:
            if e in self.slot_of:
                continue
            slot = self.take_slot(e, set(guess), stats)
            if slot is None:
                break
            self.cache.prefetched.add(e)
            stats.prefetched += 1
            todo.append((e, slot))
        return todo

    def ready(self) -> list[tuple[int, int]]:
        """Loads waited for: the (expert, slot) pairs the C side may now serve (those not evicted since)."""
        done = [(e, slot) for e, slot in self.unpublished if self.slot_of.get(e) == slot]
        self.unpublished.clear()
        return done
