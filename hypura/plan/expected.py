"""What a plan's prediction assumes, beside it: the share of a token's expert reads each tier serves, and the bound.

Hit rates per tier: a routed expert is read with its unit's probability p (routing that earlier runs recorded, else
k/E), so a tier serves the sum of p over the experts it holds, over the sum for all experts; with an expert cache
(plan/experts.py) the GPU serves its hit rate and RAM the misses. The bound: decode if each path moved only its
bytes a token at the profile's rate, all paths overlapping (cost.bytes_seconds, as hypura/speed/bound.py bounds
a run); an expert cache's misses load before its experts compute, so there the GPU and link terms add, as
speed/bound.py's expert_cache_bound adds them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hypura.plan.cost import DISK, GPU, RAM, bytes_seconds
from hypura.plan.plan import TIERS, Plan
from hypura.units import ModelUnits


@dataclass(frozen=True)
class Expected:
    decode_tok_s: float  # the plan's prediction
    expert_hits: dict  # tier -> share of a token's routed-expert reads it serves ({}: no routed experts)
    routing: str  # what the hit rates assume: "k/E", "recorded", or the expert cache's
    bound_tok_s: float
    bound_limit: str  # the path that sets the bound
    bound_seconds: dict  # path -> seconds a token (a step of `parallel` tokens) for its bytes alone

    def to_dict(self) -> dict:
        return asdict(self)


def expected(plan: Plan, mu: ModelUnits, recorded: bool = False) -> Expected:
    """plan's assumptions for the model units it was planned from (their p: the routing it planned with)."""
    pr = plan.prediction
    terms = bytes_seconds({p: pr.bytes_per_token.get(p, 0.0) for p in ("gpu", "cpu", "link", "disk")}, plan.rates,
                          plan.traffic.expert_disk_bytes, plan.traffic.host_pinned)
    if plan.expert_slots:
        hits = {GPU: plan.expert_hit_rate, RAM: 1.0 - plan.expert_hit_rate, DISK: 0.0}
        routing = f"an expert cache of {plan.expert_slots} GPU slots a layer"
        terms = {"gpu+link": terms["gpu"] + terms["link"], **{p: terms[p] for p in ("cpu", "disk")}}
    else:
        hits = _static_hits(plan, mu)
        routing = "recorded" if recorded else "k/E"
    limit = max(terms, key=terms.get)
    step_s = terms[limit]
    return Expected(pr.decode_tok_s, hits, routing, pr.parallel / step_s if step_s > 0 else float("inf"), limit,
                    terms)


def _static_hits(plan: Plan, mu: ModelUnits) -> dict:
    """Each tier's share of the expected expert reads of a token, from the plan's tier of every expert."""
    tier = {}
    for name in mu.experts:
        t = plan.placement(name)
        for e, where in enumerate(t.experts):  # an expert's slowest tier over its stacked tensors
            key = (t.layer, e)
            tier[key] = max(tier.get(key, GPU), where, key=TIERS.index)
    reads = dict.fromkeys(TIERS, 0.0)
    for u in mu.units:
        if u.expert >= 0:
            reads[tier[(u.layer, u.expert)]] += u.p
    total = sum(reads.values())
    return {t: r / total for t, r in reads.items()} if total else {}
