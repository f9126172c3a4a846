"""A Plan as a placement policy for the loader hooks.

gpu -> GPU-resident; ram computed by the CPU -> host memory, as `-ot X=CPU` places it, or, where the plan holds
them pinned (`host_pinned`: op offload copies them), at home in the mapped file, pinned in place
(mapped_weights.py); streamed tensors (ram computed on the GPU, and disk) -> their pool slot
(dense/stream_layout.py), filled by the layer streamer, a RAM-tier one from its home in the mapped file;
stacked experts with experts on disk -> host memory, filled by the expert pager (moe/expert_paging.py).
"""

from __future__ import annotations

from hypura.errors import HypuraError
from hypura.plan import Plan
from hypura.tiers.names import GPU
from hypura.profile.devices import has_gpu
from hypura.runtime.placement import Placement, PlacementPolicy, TensorInfo, Tier
from hypura.runtime.dense.stream_layout import GPU_POOL, StreamLayout

def plan_layout(plan: Plan) -> StreamLayout:
    gpu = has_gpu()
    if not gpu and any(t.tier == GPU or t.compute == GPU for t in plan.tensors):
        raise HypuraError("the plan uses a GPU, but this llama.cpp build has none: re-plan here")
    return StreamLayout.of(plan, gpu)


def ram_experts_evictable(plan: Plan) -> bool:
    """A paged stack's RAM experts join the pager's LRU (moe/expert_paging.py) where the plan chose them without
    recorded routing (every expert tied at k/E): recency then beats that arbitrary fixed set. CPU plans only: what a
    plan with a GPU runs stays as it was."""
    return not plan.routing_tokens and not any(t.tier == GPU or t.compute == GPU for t in plan.tensors)


def pinned_cpu_weights(plan: Plan, paged: set[str]) -> bool:
    """The plan's CPU weights are held pinned: op offload copies a batch's share at the link's rate (plan/cost.py,
    host_pinned); beside experts paged from disk nothing is (op offload is off there)."""
    return plan.traffic.host_pinned and not paged


def homes_mapped(plan: Plan, layout: StreamLayout, paged: set[str] = frozenset()) -> bool:
    """Some weights the GPU copies from RAM (pinned CPU weights, RAM-tier streamed tensors) live in the mapped
    file: the load maps it (mapped_weights.py)."""
    return pinned_cpu_weights(plan, paged) or layout.pinned_bytes() > 0


def plan_policy(plan: Plan, layout: StreamLayout, paged: set[str] = frozenset()) -> PlacementPolicy:
    """paged: stacked expert tensors with disk experts (moe/expert_paging.py), host memory filled by Python."""
    pinned = pinned_cpu_weights(plan, paged)

    def policy(info: TensorInfo) -> Placement:
        streamed = layout.tensors.get(info.name)
        if streamed is not None:
            return Placement(tier=Tier.GPU if streamed.pool == GPU_POOL else Tier.HOST,
                             pool_slot=layout.slot_of(info.name))
        if info.name in paged:
            return Placement(tier=Tier.HOST, defer=True)
        if plan.placement(info.name).tier == GPU:
            return Placement(tier=Tier.GPU)
        # pinned CPU weights: deferred into plain host memory that is never touched (the decision asks no_host),
        # then moved to their home in the mapped file
        return Placement(tier=Tier.HOST, defer=True) if pinned else Placement(tier=Tier.HOST)

    return policy
