"""How a plan's non-resident tensors move: whole, through the slots of a pool (include/hypura.h,
"Pools"), or expert by expert, as routers select them. The runtime builds its stream layout from this
(runtime/dense/stream_layout.py); the decision reads it for the parameters the load needs (load_params.py)."""

from __future__ import annotations

from hypura.tiers.names import CPU, DISK, GPU, RAM

GPU_POOL, HOST_POOL = "gpu", "host"


def paged_by_expert(t) -> bool:
    """A stacked expert tensor (a Plan's TensorPlacement) with experts on disk: paged, never streamed whole."""
    return bool(t.experts) and DISK in t.experts


def stream_pool(t, gpu: bool, dual: bool = False) -> str | None:
    """The pool a Plan's tensor `t` streams through on a machine with (`gpu`) or without a GPU; None: resident
    where it is computed, or paged by expert. dual: a RAM tensor some step sizes stream (the plan's step_paths)."""
    if dual:  # stacked experts too: a layer's stacks, every expert in RAM, copied whole into a slot at large steps
        return GPU_POOL if gpu else HOST_POOL
    if paged_by_expert(t):
        return None  # read expert by expert as routers select them (runtime/moe/expert_paging.py)
    # a stacked expert tensor is one buffer: some experts on the GPU beside others in RAM cannot be had, and
    # streaming it whole copies every expert, which pays at large steps only (dual, above): otherwise the CPU
    # computes it from RAM (an expert cache, plan.expert_slots, is how experts reach the GPU one by one)
    compute = CPU if t.experts and t.tier != GPU else t.compute
    if t.tier == GPU or (t.tier == RAM and (compute == CPU or not gpu)):
        return None  # resident: GPU memory, or host memory the CPU computes from
    if gpu and compute == GPU:
        return GPU_POOL
    return HOST_POOL if t.tier == DISK else None


def streamed_through_host(plan, gpu: bool) -> bool:
    """Some layer of `plan` streams through the host pool (the CPU computes it from a pool slot filled by reads)."""
    return any(stream_pool(t, gpu, t.name in plan.dual) == HOST_POOL for t in plan.tensors)
