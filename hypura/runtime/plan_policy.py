"""A Plan as a placement policy for the loader hooks.

gpu -> GPU-resident; ram computed by the CPU -> host memory, as `-ot X=CPU` places it (pinned where the
plan says so: `host_pinned`); streamed
tensors (ram computed on the GPU, and disk) -> their pool slot (dense/stream_layout.py), filled by the
layer streamer, never mapped from the file; stacked experts with experts on disk -> host memory,
filled by the expert pager (moe/expert_paging.py).
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


def plan_policy(plan: Plan, layout: StreamLayout, paged: set[str] = frozenset(),
                defer_pinned: bool = False) -> PlacementPolicy:
    """paged: stacked expert tensors with disk experts (moe/expert_paging.py), host memory filled by Python;
    defer_pinned: pinned CPU weights filled by Python too (runtime/load_fills.py, several threads)."""
    pinned = plan.traffic.host_pinned and not paged

    def policy(info: TensorInfo) -> Placement:
        streamed = layout.tensors.get(info.name)
        if streamed is not None:
            return Placement(tier=Tier.GPU if streamed.pool == GPU_POOL else Tier.HOST,
                             pool_slot=layout.slot_of(info.name))
        if info.name in paged:
            return Placement(tier=Tier.HOST, defer=True)
        if plan.placement(info.name).tier == GPU:
            return Placement(tier=Tier.GPU)
        # a plan that streams to the GPU holds its CPU weights pinned: op offload copies a batch's share at the
        # link's rate (plan/cost.py, host_pinned); beside experts paged from disk nothing is (pinned memory is
        # resident whole, and op offload is off there)
        return Placement(tier=Tier.PINNED, defer=defer_pinned) if pinned else Placement(tier=Tier.HOST)

    return policy
