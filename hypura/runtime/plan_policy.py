"""A Plan as a placement policy for the loader hooks.

gpu -> GPU-resident; ram -> host memory (pinned when the plan computes it on the GPU, so a
later copy is fast); disk -> needs the streaming runtime, which this build does not have yet:
refused with a clear error instead of silently mapping the file.
"""

from __future__ import annotations

import os
from typing import Union

from hypura.errors import HypuraError
from hypura.model_file import ModelHeader
from hypura.plan import Plan, PlanSettings, plan_model
from hypura.profile import machine_profile
from hypura.profile.devices import has_gpu
from hypura.runtime.placement import Placement, PlacementPolicy, TensorInfo, Tier

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
        plan = plan_model(header, machine_profile(), gpu_mem=gpu_mem, ram=ram, settings=settings)
    else:
        plan = Plan.load(spec)
    plan.check_model(header)
    on_disk = [t.name for t in plan.tensors if t.tier == "disk"]
    if on_disk:
        raise HypuraError(
            f"the plan streams {len(on_disk)} tensors from disk (e.g. {on_disk[0]}), which needs the tier "
            "runtime (not in this version): give more --ram or a plan with gpu and ram tiers only"
        )
    return plan


def plan_policy(plan: Plan) -> PlacementPolicy:
    gpu = has_gpu()
    if not gpu and any(t.tier == "gpu" for t in plan.tensors):
        raise HypuraError("the plan places tensors on a GPU, but this llama.cpp build has none: re-plan here")

    def policy(info: TensorInfo) -> Placement:
        planned = plan.placement(info.name)
        if planned.tier == "gpu":
            return Placement(tier=Tier.GPU)
        return Placement(tier=Tier.PINNED if planned.compute == "gpu" and gpu else Tier.HOST)

    return policy
