"""A step's load over every unit of a placement at once: what StepLoad.add (plan/cost.py) sums unit by unit, from
per-unit arrays made once per model and step size, so the search's split (plan/solve.py) need not add thousands of
experts one by one for each of its configs, step sizes and RAM budgets.

The sums are the unit-by-unit ones to the last bit, so the split compares the same times and breaks ties the same
way: np.cumsum adds left to right in graph order, as the loop does, and a unit another path takes adds 0.0 there,
which changes no sum (np.sum would add pairwise, a different rounding). Each unit's own terms are computed as
StepLoad.add computes them (step_probability per unit, not a vectorised power)."""

from __future__ import annotations

import numpy as np

from hypura.plan.cost import CPU, DISK, GPU, RAM, StepLoad, step_probability
from hypura.units import ModelUnits

# a tier or device as a small integer, for the arrays
CODE = {GPU: 0, RAM: 1, DISK: 2, CPU: 3}


def codes(names) -> np.ndarray:
    """Tiers or devices (GPU, RAM, DISK, CPU names) as an array of CODE."""
    return np.fromiter(map(CODE.__getitem__, names), np.int8, len(names))


class UnitSums:
    """Per-unit arrays of a model, and a step's StepLoad over a placement from them (`load`)."""

    def __init__(self, mu: ModelUnits):
        self.units = mu.units
        self.nbytes = np.array([float(u.nbytes) for u in mu.units])
        self.expert = np.array([u.expert >= 0 for u in mu.units], dtype=bool)
        self.host_only = np.array([u.host_only for u in mu.units], dtype=bool)
        self.stage = np.array([u.stage + 1 for u in mu.units], dtype=np.int64)  # from 0: the input's stage is -1
        self.n_stages = int(self.stage.max()) + 1 if len(self.stage) else 0
        self._terms: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def terms(self, parallel: int) -> tuple[np.ndarray, np.ndarray]:
        """Each unit's bytes and FLOPs at a step of `parallel` tokens, as StepLoad.add computes them (sign 1)."""
        if parallel not in self._terms:
            read = np.array([step_probability(u.p, parallel) * u.nbytes for u in self.units])
            flops = np.array([0.0 if u.host_only else 2.0 * parallel * u.elements * u.p for u in self.units])
            self._terms[parallel] = (read, flops)
        return self._terms[parallel]

    def load(self, step: StepLoad, tiers: np.ndarray, compute: np.ndarray) -> StepLoad:
        """`step` (empty) with every unit added as StepLoad.add(u, tiers[i], compute[i]) in graph order would."""
        read, flops = self.terms(step.parallel)
        disk, ram = tiers == CODE[DISK], tiers == CODE[RAM]
        gpu = compute == CODE[GPU]
        host = ~gpu & ram & ~self.host_only
        cpu = ~gpu & ~host
        link = gpu & (ram | (disk & (not step.rates.unified)))
        # a RAM expert streams with its layer's whole stacks (cost.streamed_bytes)
        link_bytes = np.where(ram & self.expert, self.nbytes, read)
        masks = np.stack([gpu, cpu, host, disk, disk & self.expert, cpu & self.host_only, gpu, cpu, host, link])
        values = np.stack([read] * 6 + [flops] * 3 + [link_bytes])
        if len(read):
            sums = np.cumsum(np.where(masks, values, 0.0), axis=1)[:, -1].tolist()
        else:
            sums = [0.0] * len(masks)
        (step.gpu, step.cpu, step.host, step.disk, step.expert_disk, step.rows, step.gpu_flops, step.cpu_flops,
         step.host_flops, step.link) = sums
        step.host_copy = step.host  # the same terms of the same units
        step.disk_cpu = int(np.count_nonzero(disk & ~gpu & ~self.host_only))
        return step

    def stage_need(self, selected: np.ndarray, tiers: np.ndarray, k: int) -> dict[int, int]:
        """Bytes each layer with a `selected` unit must have in a slot (_Problem.stage_need): its selected dense
        units and RAM experts (stacks streamed whole) plus its k largest selected experts elsewhere."""
        selected = selected & ~self.host_only
        apart = selected & self.expert & (tiers != CODE[RAM])
        whole = selected & ~apart
        n = self.n_stages
        # integer bytes summed as float64: exact in any order below 2**53 bytes
        need = np.bincount(self.stage[whole], weights=self.nbytes[whole], minlength=n)
        if apart.any():
            stage, nbytes = self.stage[apart], self.nbytes[apart]
            order = np.lexsort((-nbytes, stage))  # by layer, the largest first
            stage, nbytes = stage[order], nbytes[order]
            rank = np.arange(len(stage)) - np.searchsorted(stage, stage)  # within its layer
            need = need + np.bincount(stage[rank < k], weights=nbytes[rank < k], minlength=n)
        return {int(s) - 1: int(need[s]) for s in np.unique(self.stage[selected])}
