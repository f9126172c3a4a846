"""A stack of expert caches (a GPU cache over a RAM cache over disk) per layer: a reference for the
policies' hit rates on recorded routing (test_expert_cache.py)."""

from hypura.runtime.mechanism import TierStats as CacheStats
from hypura.runtime.moe.expert_cache import DEFAULT_POLICY, LayerCache


class TieredExpertCache:
    """Per layer, one LayerCache per tier (fastest first); below the last tier lies `floor` (disk)."""

    def __init__(self, n_layer: int, capacities: dict[str, int], policy: str = DEFAULT_POLICY,
                 floor: str = "disk"):
        self.tiers = list(capacities)
        self.floor = floor
        self.layers = [{t: LayerCache(capacities[t], policy) for t in self.tiers} for _ in range(n_layer)]
        self.stats = CacheStats()

    def access(self, layer: int, experts) -> dict[int, str]:
        """One token's selected experts at `layer`: where each was served from; the caches then hold them."""
        caches = self.layers[layer]
        needed = set(int(e) for e in experts)
        served = {}
        for e in needed:
            tier = next((t for t in self.tiers if e in caches[t].resident), self.floor)
            served[e] = tier
            self.stats.accesses += 1
            self.stats.hits[tier] += 1
            for t in self.tiers:  # a prefetched expert counts once, at its first use
                if e in caches[t].prefetched:
                    caches[t].prefetched.discard(e)
                    self.stats.prefetch_used += 1
                    break
            for t in self.tiers:
                if caches[t].insert(e, needed):
                    caches[t].touch(e)
        return served

    def prefetch(self, layer: int, experts, tier: str) -> int:
        """Bring `experts` of `layer` into `tier` ahead of use; returns how many were brought."""
        cache, brought = self.layers[layer][tier], 0
        for e in experts:
            e = int(e)
            if e in cache.resident or not cache.insert(e, set()):
                continue
            cache.prefetched.add(e)
            brought += 1
        self.stats.prefetched += brought
        return brought
