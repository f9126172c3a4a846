"""Expert caches and their policies, counted as docs/design.md defines the metrics.

A cache holds whole experts of one layer (the unit the runtime loads: one expert's slice of each
stacked `ffn_*_exps` tensor). An access is one (token, layer, selected expert), counted once per
access (not per graph node); a miss takes the slot of the policy's victim. Prefetched experts are
marked until used or evicted, for precision and recall.

Policies score resident experts; the lowest score is evicted:
  lru    time of the last access
  lfu    number of accesses
  decay  frequency with exponential decay (half-life in accesses of the layer): recent popularity
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
