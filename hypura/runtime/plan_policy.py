"""A Plan as a placement policy for the loader hooks.

gpu -> GPU-resident; ram computed by the CPU -> host memory, as `-ot X=CPU` places it; streamed
tensors (ram computed on the GPU, and disk) -> their pool slot (dense/stream_layout.py), filled by the
layer streamer, never mapped from the file; stacked experts with experts on disk -> host memory,
filled by the expert pager (moe/expert_paging.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Union

from hypura.errors import HypuraError
from hypura.modelfile import ModelHeader
from hypura.plan import Plan, PlanSettings, plan_model
from hypura.tiers.names import GPU
from hypura.profile.measure import planning_profile
from hypura.profile.devices import has_gpu
from hypura.profile.model import MachineProfile
from hypura.runtime.moe.coactivation import routing_frequencies
from hypura.runtime.placement import Placement, PlacementPolicy, TensorInfo, Tier
from hypura.runtime.dense.stream_layout import GPU_POOL, StreamLayout

PlanSpec = Union[Plan, str, os.PathLike, None]


def resolve_plan(spec: PlanSpec, header: ModelHeader, gpu_mem=None, ram=None, n_ctx: int = 4096,
                 n_ubatch: int = 512) -> Plan | None:
    """The plan to load with: given, read from a file, or made now ("auto", or budgets given)."""
    if spec is None and gpu_mem is None and ram is None:
        return None  # no plan asked for: llama.cpp's own placement (-ngl, -ot)
    if isinstance(spec, Plan):
        plan = spec
    elif spec is None or str(spec) == "auto":
        settings = PlanSettings(n_ctx=n_ctx or int(header.get("context_length", 4096)), n_ubatch=n_ubatch)
        plan = plan_with_routing(header, planning_profile(header.path), gpu_mem=gpu_mem, ram=ram, settings=settings)
    else:
        plan = Plan.load(spec)
    plan.check_model(header)
    return plan


def plan_with_routing(header: ModelHeader, profile: MachineProfile, **kwargs) -> Plan:
    """plan_model with the expert frequencies of this model's recorded routing (moe/coactivation.py), once
    enough tokens were recorded: often-chosen experts then take RAM before rare ones."""
    probs, tokens = routing_frequencies(header)
    plan = plan_model(header, profile, expert_probs=probs, **kwargs)
    return dataclasses.replace(plan, routing_tokens=tokens) if probs else plan


def plan_layout(plan: Plan) -> StreamLayout:
    gpu = has_gpu()
    if not gpu and any(t.tier == GPU or t.compute == GPU for t in plan.tensors):
        raise HypuraError("the plan uses a GPU, but this llama.cpp build has none: re-plan here")
    return StreamLayout.of(plan, gpu)


def plan_policy(plan: Plan, layout: StreamLayout, paged: set[str] = frozenset()) -> PlacementPolicy:
    """paged: stacked expert tensors with disk experts (moe/expert_paging.py), host memory filled by Python."""
    def policy(info: TensorInfo) -> Placement:
        streamed = layout.tensors.get(info.name)
        if streamed is not None:
            return Placement(tier=Tier.GPU if streamed.pool == GPU_POOL else Tier.HOST,
                             pool_slot=layout.slot_of(info.name))
        if info.name in paged:
            return Placement(tier=Tier.HOST, defer=True)
        return Placement(tier=Tier.GPU if plan.placement(info.name).tier == GPU else Tier.HOST)

    return policy
