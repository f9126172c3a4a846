"""Which tensors of a Plan stream, through which pool, and each streamed layer's slot.

A streamed tensor lives in a pool slot (include/hypura.h, "Pools") and is computed where its pool
is: the GPU pool when the plan computes it on the GPU, the host pool when the CPU computes a
disk-tier tensor. Its bytes come from RAM (its pages in the mapped file, pinned at load: ../mapped_weights.py)
or disk (read each time with O_DIRECT). Layers take slots round-robin in graph order, so the layers in flight at once
(the one computing and up to prefetch-depth ahead) never share a slot.

A RAM tensor that some step sizes stream and others compute on the CPU (the plan's `step_paths`) is
`dual`: it has a pool slot and a home, its bytes in the mapped file, where the CPU computes it in place; the
layer streamer moves it between them as the step size asks (dense/layer_streamer.py). A MoE layer's stacked
expert tensors, every expert in RAM, can be dual too: streamed whole, home in the mapped file (ggml's plain layout).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypura.plan import Plan
from hypura.plan.pools import GPU_POOL, HOST_POOL, stream_pool  # noqa: F401  (re-exported)
from hypura.tiers.names import DISK, RAM


@dataclass(frozen=True)
class Streamed:
    name: str
    layer: int  # graph order: the block, or n_layer for the output head
    pool: str  # GPU_POOL | HOST_POOL
    source: str  # RAM | DISK
    nbytes: int
    dual: bool = False  # streamed at some step sizes, computed in place by the CPU at others


@dataclass(frozen=True)
class StreamLayout:
    tensors: dict  # name -> Streamed
    slots: dict  # pool -> number of slots
    layer_slot: dict  # (pool, layer) -> slot

    @classmethod
    def empty(cls) -> StreamLayout:
        return cls({}, {}, {})

    @classmethod
    def of(cls, plan: Plan, gpu: bool) -> StreamLayout:
        tensors = {}
        dual = plan.dual
        for t in plan.tensors:
            pool = stream_pool(t, gpu, t.name in dual)
            if pool is not None:
                layer = t.layer if t.layer >= 0 else plan.n_layer  # the output head runs after the blocks
                source = DISK if t.tier == DISK and t.name not in dual else RAM
                tensors[t.name] = Streamed(t.name, layer, pool, source, t.nbytes, t.name in dual)
        slots = {GPU_POOL: max(plan.pool_slots, 1), HOST_POOL: max(plan.staging_slots, 1)}
        layer_slot = {}
        for pool in (GPU_POOL, HOST_POOL):
            layers = sorted({s.layer for s in tensors.values() if s.pool == pool})
            layer_slot.update({(pool, layer): i % slots[pool] for i, layer in enumerate(layers)})
        return cls(tensors, slots, layer_slot)

    def slot_of(self, name: str) -> int:
        s = self.tensors[name]
        return self.layer_slot[(s.pool, s.layer)]

    def layers(self, pool: str) -> list[int]:
        return sorted(layer for p, layer in self.layer_slot if p == pool)

    def pool_bytes(self, pool: str) -> int:
        """What a pool's slots take: each as large as the largest layer (a layer may move to any slot)."""
        per_layer: dict = {}
        for t in self.tensors.values():
            if t.pool == pool:
                per_layer[t.layer] = per_layer.get(t.layer, 0) + t.nbytes
        slots = len({self.layer_slot[(pool, layer)] for layer in per_layer})
        return slots * max(per_layer.values(), default=0)

    def pinned_bytes(self) -> int:
        """RAM-sourced streamed bytes: the pinned pages of the mapped file the GPU pool is filled from."""
        return sum(s.nbytes for s in self.tensors.values() if s.source == RAM)

