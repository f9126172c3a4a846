"""What every decode-time tier mechanism (layer streamer, expert cache, expert pager, routing recorder)
offers the runtime, and the one stats type they count in; `Mechanism` itself does nothing (vLLM's
NoopOffloader plays that part there).

Threading: every method runs on the thread that calls llama_decode, between decodes (the hooks
that update the counters run on it too, inside llama_decode), so nothing here takes a lock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class TierStats:
    accesses: int = 0  # (token, selected expert) pairs a mechanism served
    hits: Counter = field(default_factory=Counter)  # tier -> accesses served there without a load
    loads: int = 0  # units (layers, experts) brought into faster memory
    demand_loads: int = 0  # of those, started only when compute needed them
    bytes: Counter = field(default_factory=Counter)  # source tier -> bytes moved
    stall_s: float = 0.0  # compute waited for weights (docs/design.md, "Metrics")
    waits: int = 0
    evictions: int = 0
    prefetched: int = 0
    prefetch_used: int = 0  # prefetched units a later access used (each counted once, at its first use)
    prefetch_late: int = 0  # of those, units whose load compute still had to wait for when it needed them
    prefetch_wasted: int = 0  # prefetched units evicted before any access used them

    def hit_rate(self, tier: str) -> float:
        return self.hits[tier] / self.accesses if self.accesses else 0.0

    @property
    def precision(self) -> float:
        return self.prefetch_used / self.prefetched if self.prefetched else 0.0

    @property
    def recall(self) -> float:
        return self.prefetch_used / self.accesses if self.accesses else 0.0

    def prefetch_dict(self) -> dict:
        """Prefetches issued, used (in time or late), wasted; precision and recall (docs/design.md, "Metrics")."""
        return {"issued": self.prefetched, "used": self.prefetch_used, "late": self.prefetch_late,
                "wasted": self.prefetch_wasted, "precision": self.precision, "recall": self.recall}

    def traffic_dict(self) -> dict:
        return {"bytes": dict(self.bytes), "loads": self.loads, "demand_loads": self.demand_loads,
                "stall_s": self.stall_s, "waits": self.waits}

    def add_traffic(self, other: TierStats) -> None:
        self.bytes.update(other.bytes)
        self.loads += other.loads
        self.demand_loads += other.demand_loads
        self.stall_s += other.stall_s
        self.waits += other.waits


class Mechanism:
    """A decode-time mechanism; this base one moves nothing."""

    name = ""  # its key in Llama.stats(); "" for none
    traffic: TierStats  # bytes moved and stall since load, never reset: per-token figures difference it

    def __init__(self):
        self.traffic = TierStats()

    def after_decode(self) -> None:
        """Right after each llama_decode: raise what failed in it, replay what C answered alone."""

    def summary(self) -> Optional[dict]:
        return None

    def reset_stats(self) -> None:
        """Since-load counters stay (traffic); the mechanism's own since-reset ones start over."""

    def close(self) -> None:
        """Stop every thread and read; the runtime calls it before the model goes (or after, where said)."""
