"""The expert-cache alternative for an MoE plan: GPU slots that decode computes from, filled from
pinned RAM as routers ask (hypura.runtime.moe.expert_streaming), instead of a fixed set of GPU experts.

Same GPU bytes: the static plan's GPU-resident experts become slots, spread evenly over the MoE
layers, and every expert lives in RAM. A decode token then costs
  GPU reads: the non-expert GPU tensors, and k experts a layer from slots     / GPU rate
  + the non-expert tensors the plan leaves in RAM                               / CPU rate
  + the missed experts, (1 - h) of them, brought by the copy engine            / link rate
    (the runtime can have the CPU compute a share of them, but that measured slower so far)
  + one host round trip per MoE layer (router result read, slot ids written)    EXPERT_LAYER_S
with h the cache's hit rate: from routing frequencies when known (a cache of s slots holding the s
most popular experts), else s / E (uniformly random routing, the worst case). The plan takes the
cache when that predicts faster decode than the static placement; prefill keeps its prediction
(large batches compute from the experts in RAM either way).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from hypura.plan import knobs
from hypura.plan.cost import CPU, DISK, GPU, RAM, Prediction
from hypura.plan.plan import Plan
from hypura.units import ModelUnits


def with_expert_cache(plan: Plan, mu: ModelUnits, expert_probs: Mapping[int, Sequence[float]] | None) -> Plan:
    r, dims = plan.rates, mu.dims
    if not mu.experts or r.gpu_read is None or not r.link or plan.unified:
        return plan
    if plan.prediction.parallel > 1:
        return plan  # the cache serves one-token batches (ExpertCacheSettings.max_tokens): a batch computes from RAM
    if plan.streams_stacks:
        return plan  # stacks streamed whole at large steps have their home in the layer streamer's pinned RAM
    experts = [u for u in mu.units if u.expert >= 0]
    tiers = _expert_tiers(plan, mu)
    if DISK in tiers.values():
        return plan  # caches load from RAM only
    layers = sorted({u.layer for u in experts})
    per_expert = max(u.nbytes for u in experts)
    on_gpu = sum(u.nbytes for u in experts if tiers[(u.layer, u.expert)] == GPU)
    slots = on_gpu // (len(layers) * per_expert)
    k, n_expert = dims.n_expert_used, dims.n_expert
    if slots < k or slots >= n_expert or plan.used(RAM) + on_gpu > plan.memory[RAM]["budget"]:
        return plan
    if expert_probs:
        hits = [expected_hit_rate(expert_probs[layer], slots) for layer in layers if layer in expert_probs]
        hit_rate = sum(hits) / len(hits) if hits else slots / n_expert
    else:
        hit_rate = slots / n_expert
    used = k * len(layers) * per_expert  # a token's experts, read from slots
    dense = [u for u in mu.units if u.expert < 0 and u.p >= 1.0]  # read by every token
    other_gpu = sum(u.nbytes for u in dense if plan.tier_of(u.tensors[0]) == GPU)
    other_cpu = sum(u.nbytes for u in dense if plan.tier_of(u.tensors[0]) != GPU)
    missed = (1 - hit_rate) * used
    nbytes = {GPU: other_gpu + used, CPU: other_cpu, "link": missed, DISK: 0}
    seconds = {GPU: nbytes[GPU] / r.gpu_read, CPU: nbytes[CPU] / r.cpu_read, "link": nbytes["link"] / r.link,
               DISK: 0.0, "overhead": len(layers) * knobs.EXPERT_LAYER_S + dims.n_layer * r.gpu_layer_s}
    # one after the other: a layer's misses are in before its experts compute
    tok_s = 1 / sum(seconds.values())
    if tok_s <= plan.prediction.decode_tok_s:
        return plan
    prediction = Prediction(tok_s, max((GPU, CPU, "link"), key=seconds.get), plan.prediction.prefill_tok_s,
                            plan.prediction.prefill_limit, seconds, nbytes)
    stacked = [dataclasses.replace(t, tier=RAM, compute=CPU, experts=(RAM,) * len(t.experts),
                                   expert_compute=(CPU,) * len(t.experts)) if t.experts else t
               for t in plan.tensors]
    memory = {tier: dict(m) for tier, m in plan.memory.items()}
    memory[RAM]["weights"] += on_gpu  # the GPU keeps the bytes, as slots
    return dataclasses.replace(
        plan, tensors=tuple(stacked), mode="expert-cache", memory=memory, prediction=prediction,
        expert_cache={GPU: slots * len(layers), RAM: n_expert * len(layers), DISK: 0},
        expert_slots=slots, expert_hit_rate=hit_rate,
        config=plan.config + f" [expert cache: {slots} slots a layer]")


def _expert_tiers(plan: Plan, mu: ModelUnits) -> dict[tuple[int, int], str]:
    """(layer, expert) -> the plan's tier for that expert (its slowest over the stacked tensors)."""
    order = {GPU: 0, RAM: 1, DISK: 2}
    out: dict[tuple[int, int], str] = {}
    for name in mu.experts:
        t = plan.placement(name)
        for e, tier in enumerate(t.experts):
            cur = out.get((t.layer, e), GPU)
            out[(t.layer, e)] = tier if order[tier] > order[cur] else cur
    return out


def expected_hit_rate(freqs, capacity: int) -> float:
    """A static cache of the `capacity` most popular experts under independent routing: the share of
    accesses it serves (for comparing a policy with the best static placement)."""
    f = sorted((float(x) for x in freqs), reverse=True)
    total = sum(f)
    return sum(f[:capacity]) / total if total and not math.isnan(total) else 0.0
