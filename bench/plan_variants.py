"""Diagnostic variants of a plan, for bench/h200_tier_runtime.sh diag: the KV cache moved to the GPU,
and fewer streamed layers (the rest computed by the CPU, as -ngl does), down to none. The tok/s of
each against its streamed bytes shows what a streamed byte costs the CPU (shared RAM bandwidth)."""

import dataclasses
import sys

from hypura.plan import Plan


def kv_on_gpu(plan: Plan) -> Plan:
    return dataclasses.replace(plan, kv_tier="gpu", config=plan.config + " [kv on gpu]")


def stream_only(plan: Plan, n_layers: int) -> Plan:
    """Keep n of the streamed blocks, evenly spread; the others are computed by the CPU."""
    streamed = sorted({t.layer for t in plan.tensors if t.tier != "gpu" and t.compute == "gpu" and t.layer >= 0})
    keep = {streamed[i * len(streamed) // n_layers] for i in range(n_layers)} if n_layers else set()
    tensors = tuple(dataclasses.replace(t, compute="cpu")
                    if t.tier != "gpu" and t.compute == "gpu" and t.layer >= 0 and t.layer not in keep else t
                    for t in plan.tensors)
    return dataclasses.replace(plan, tensors=tensors, pool_slots=plan.pool_slots if n_layers else 0,
                               config=plan.config + f" [{n_layers} blocks streamed]")


if __name__ == "__main__":
    base = Plan.load(sys.argv[1])
    stem = sys.argv[1].removesuffix("-auto.json")
    kv = kv_on_gpu(base)
    kv.save(f"{stem}-kvgpu.json")
    for n in map(int, sys.argv[2:]):
        stream_only(kv, n).save(f"{stem}-kvgpu-s{n}.json")
