"""The RAM staging a placement's disk units need, as the runtime lays it out (runtime/runtime.py,
runtime/dense/stream_layout.py), for the search (solve.py): with a GPU, prefetch depth + 1 slots each as large as
the largest layer's disk units; on the CPU, the host pool's slots for dense disk layers and, apart, the pager's share:
the experts one micro-batch may select of a layer (_Problem.per_call, plan/microbatch.py), which the pager keeps
until that layer computed."""

from __future__ import annotations

from hypura.plan.cost import DISK
from hypura.plan.unit_sums import CODE, as_codes


def staging_slots(p, tiers, compute, n_stage: int) -> list[int]:
    """The staging of problem `p`'s placement (tiers, compute), one entry a slot: n_stage slots each as large as
    the largest layer (slots_need) with a GPU; without, the host pool's slots (those the layers with dense disk units
    take, each as large as the largest) and one more entry, the pager's: the largest layer's per_call disk experts."""
    if p.r.has_gpu:
        stages = p.slots_need(tiers, compute, lambda t, c: t == DISK, n_stage)
        return [max(stages)] * len(stages) if stages else stages
    dense, experts = disk_parts(p, tiers)
    host = [max(dense.values())] * min(n_stage, len(dense)) if dense else []
    return host + ([max(experts.values())] if experts else [])


def disk_parts(p, tiers) -> tuple[dict[int, int], dict[int, int]]:
    """(layer -> its dense disk units' bytes, layer -> the bytes of its largest per_call disk experts)."""
    t = as_codes(tiers)
    on_disk = t == CODE[DISK]
    dense = p.sums.stage_need(on_disk & ~p.sums.expert, t, p.per_call)
    experts = p.sums.stage_need(on_disk & p.sums.expert, t, p.per_call)
    return {s: b for s, b in dense.items() if b}, {s: b for s, b in experts.items() if b}


def stage_strides(p) -> list[int]:
    """The staging slot sizes worth trying: each stage's bytes with all of it on disk, smallest first."""
    everything = [DISK] * len(p.mu.units)
    return sorted(set(p.stage_need(everything, everything, lambda t, c: True).values()))


def staging_reserves(p, n: int) -> list[int]:
    """The staging worth reserving in n slots at the RAM floor (`staging_slots`), smallest first: n slots of each stride
    with a GPU; on the CPU, n host-pool slots of a layer's dense disk units (or none) beside the pager's largest
    share (or none)."""
    if p.r.has_gpu:
        return [n * stride for stride in stage_strides(p)]
    dense, experts = disk_parts(p, [DISK] * len(p.mu.units))
    pager = max(experts.values(), default=0)
    return sorted({n * d + e for d in {0, *dense.values()} for e in {0, pager}} - {0})
