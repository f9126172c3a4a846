"""The search's sums over every unit of a placement at once, from per-unit arrays made once a model: a step's load
(what StepLoad.add in plan/cost.py sums unit by unit), its time along the split's walk at every prefix
(`walk_seconds`), a layer's slot bytes, so the search (plan/solve.py) need not visit thousands of experts one by one
for each of its configs, step sizes and RAM budgets.

The sums are the unit-by-unit ones to the last bit, so the split compares the same times and breaks ties the same
way: np.cumsum adds left to right in graph order, as a loop of += does (np.sum would add pairwise, another
rounding); where one array holds several paths' terms the others add 0.0, which changes no sum; each unit's terms
are StepLoad.add's products, the power of its p taken by step_probability itself (once per distinct p).
tests/test_unit_sums.py holds each equal to the unit-by-unit computation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hypura.plan import knobs
from hypura.plan.cost import CPU, DISK, GPU, RAM, StepLoad, step_probability
from hypura.units import ModelUnits

# a tier or device as a small integer, for the arrays
CODE = {GPU: 0, RAM: 1, DISK: 2, CPU: 3}


def codes(names) -> np.ndarray:
    """Tiers or devices (GPU, RAM, DISK, CPU names) as an array of CODE."""
    return np.fromiter(map(CODE.__getitem__, names), np.int8, len(names))


def as_codes(names_or_codes) -> np.ndarray:
    """codes(), or an array of them as it is."""
    return names_or_codes if isinstance(names_or_codes, np.ndarray) else codes(names_or_codes)


@dataclass(frozen=True)
class Placed:
    """The units (indices, graph order) each StepLoad sum takes for one placement (UnitSums.placed)."""

    read: dict[str, np.ndarray]  # StepLoad field -> the units whose bytes read it sums
    flops: dict[str, np.ndarray]  # StepLoad field -> the units whose FLOPs it sums
    link: np.ndarray  # the units the link carries
    whole: np.ndarray  # of those, the RAM experts: their whole bytes
    disk_cpu: int


def _in_order(terms: np.ndarray) -> float:
    """terms summed one after the other, as a loop of += does (np.sum would add pairwise, another rounding)."""
    return float(np.cumsum(terms)[-1]) if len(terms) else 0.0


class UnitSums:
    """Per-unit arrays of a model, and a step's StepLoad over a placement from them (`load`)."""

    def __init__(self, mu: ModelUnits):
        self.nbytes = np.array([float(u.nbytes) for u in mu.units])
        self.nbytes_int = np.array([u.nbytes for u in mu.units], dtype=np.int64)
        self.p = np.array([u.p for u in mu.units], dtype=float)
        self.elements = np.array([float(u.elements) for u in mu.units])
        self.expert = np.array([u.expert >= 0 for u in mu.units], dtype=bool)
        self.host_only = np.array([u.host_only for u in mu.units], dtype=bool)
        self.resident = np.array([u.resident for u in mu.units], dtype=bool)  # never streamed (Unit.resident)
        self.stage = np.array([u.stage + 1 for u in mu.units], dtype=np.int64)  # from 0: the input's stage is -1
        self.n_stages = int(self.stage.max()) + 1 if len(self.stage) else 0
        self._terms: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def terms(self, parallel: int) -> tuple[np.ndarray, np.ndarray]:
        """Each unit's bytes and FLOPs at a step of `parallel` tokens, as StepLoad.add computes them (sign 1)."""
        if parallel not in self._terms:
            # the power once per distinct p (a model's experts share a few), then the products StepLoad.add takes
            ps, which = np.unique(self.p, return_inverse=True)
            chance = np.array([step_probability(float(p), parallel) for p in ps])[which.reshape(-1)]
            read = chance * self.nbytes
            flops = np.where(self.host_only, 0.0, 2.0 * parallel * self.elements * self.p)
            self._terms[parallel] = (read, flops)
        return self._terms[parallel]

    def placed(self, tiers: np.ndarray, compute: np.ndarray, unified: bool) -> Placed:
        """Which units each of a step's sums takes, units in `tiers` computed on `compute` (CODE arrays), as
        StepLoad.add sends them: the same at every step size."""
        disk, ram = tiers == CODE[DISK], tiers == CODE[RAM]
        gpu = compute == CODE[GPU]
        host = ~gpu & ram & ~self.host_only
        cpu = ~gpu & ~host
        link = gpu & (ram | (disk & (not unified)))
        at = {"gpu": gpu, "cpu": cpu, "host": host, "disk": disk, "expert_disk": disk & self.expert,
              "rows": cpu & self.host_only}
        return Placed({f: np.flatnonzero(m) for f, m in at.items()},
                      {f + "_flops": np.flatnonzero(at[f]) for f in ("gpu", "cpu", "host")}, np.flatnonzero(link),
                      (ram & self.expert)[link], int(np.count_nonzero(disk & ~gpu & ~self.host_only)))

    def load(self, step: StepLoad, placed: Placed) -> StepLoad:
        """`step` (empty) with every unit added as StepLoad.add would add them one by one in graph order."""
        read, flops = self.terms(step.parallel)
        for f, units in placed.read.items():
            setattr(step, f, _in_order(read[units]))
        for f, units in placed.flops.items():
            setattr(step, f, _in_order(flops[units]))
        # a RAM expert streams with its layer's whole stacks (cost.streamed_bytes)
        step.link = _in_order(np.where(placed.whole, self.nbytes[placed.link], read[placed.link]))
        step.host_copy = step.host  # the same terms of the same units
        step.disk_cpu = placed.disk_cpu
        return step

    def bytes_in(self, selected: np.ndarray) -> int:
        """The bytes of the selected units."""
        return int(self.nbytes_int[selected].sum())

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


@dataclass(frozen=True)
class Moves:
    """A walk's moves to GPU compute at one step size, in order: each a dense unit (`disk`: from the disk tier,
    else RAM) or a layer's RAM expert stacks, with the bytes the step reads of it, its FLOPs and what the link
    carries (a unit: what it reads; stacks: their whole bytes)."""

    read: np.ndarray
    flops: np.ndarray
    link: np.ndarray
    disk: np.ndarray


def walk_seconds(steps: list[StepLoad], moves: list[Moves]) -> np.ndarray:
    """The time of each step (StepLoad.seconds; a row each) before any move and after each prefix of its `moves`:
    what the split's walk compares, at every prefix and step size at once. The steps differ in their size alone
    (the same placement, op offload and pinning); their moves, in the terms of each. The fields after each move
    are cumulative sums of the moves' terms, added in the order StepLoad.add and move_stacks add them (a disk unit's
    bytes leave the disk path and come back); the time is StepLoad.seconds and cost.decode_seconds on arrays, and
    tests/test_unit_sums.py holds the two equal to the bit: a change to one is a change to the other."""
    step, r, disk_moves = steps[0], steps[0].rates, moves[0].disk

    def start(field: str) -> np.ndarray:
        return np.array([getattr(s, field) for s in steps], dtype=float)[:, None]

    def after(field: str, terms: np.ndarray) -> np.ndarray:
        return np.cumsum(np.concatenate((start(field), terms), axis=1), axis=1)

    read, flops = np.stack([mv.read for mv in moves]), np.stack([mv.flops for mv in moves])
    parallel = np.array([s.parallel for s in steps])[:, None]
    gpu, gpu_flops = after("gpu", read), after("gpu_flops", flops)
    ram_read, ram_flops = np.where(disk_moves, 0.0, -read), np.where(disk_moves, 0.0, -flops)  # leave the host
    disk_read, disk_flops = np.where(disk_moves, -read, 0.0), np.where(disk_moves, -flops, 0.0)  # leave the CPU
    host, host_copy, host_flops = after("host", ram_read), after("host_copy", ram_read), after("host_flops", ram_flops)
    cpu, cpu_flops = after("cpu", disk_read), after("cpu_flops", disk_flops)
    # a disk unit's bytes: off the disk path (its CPU compute gone), then on again (read for the GPU)
    out_in = np.stack([disk_read, np.where(disk_moves, read, 0.0)], axis=2)
    disk = after("disk", out_in.reshape(len(steps), -1))[:, ::2]
    disk_cpu = step.disk_cpu - np.concatenate(([0], np.cumsum(disk_moves)))
    link = after("link", np.where(disk_moves & r.unified, 0.0, np.stack([mv.link for mv in moves])))
    rows, expert_disk = start("rows"), start("expert_disk")

    offload_on = ((step.op_offload_on and r.has_gpu and not r.unified) & (parallel >= knobs.OP_OFFLOAD_MIN_BATCH)
                  & (disk_cpu == 0))
    p_gpu, p_gpu_flops = np.where(offload_on, gpu + host, gpu), np.where(offload_on, gpu_flops + host_flops, gpu_flops)
    p_cpu, p_cpu_flops = np.where(offload_on, cpu, cpu + host), np.where(offload_on, cpu_flops, cpu_flops + host_flops)
    offload = np.where(offload_on, host_copy, 0.0)

    cpu_rate = r.cpu_rate(step.pinned)
    gpu_flop_rate = r.gpu_flops or knobs.GPU_FLOPS_DEFAULT
    gpu_s = _div(p_gpu, r.gpu_read) + _div(p_gpu_flops * (parallel - 1) / parallel, gpu_flop_rate)
    cpu_flop_rate = np.where(link > 0, r.cpu_flops * knobs.CPU_BATCH_FLOPS_BESIDE_STREAMING, r.cpu_flops * 1.0)
    gain = np.array([r.cpu_gain(s.parallel) for s in steps], dtype=float)[:, None]
    cpu_s = (_div(p_cpu, cpu_rate) + _div(p_cpu_flops * (parallel - 1) / parallel, cpu_flop_rate)) / gain
    offload_s = _div(offload, r.host_copy_rate(step.pinned))
    beside = (p_cpu - rows > 0) if (r.link and not r.unified) else np.zeros(p_cpu.shape, dtype=bool)
    streamed_s = _div(link, np.where(beside, (r.link or 0.0) * knobs.LINK_BESIDE_CPU, r.link or 0.0))
    clash = knobs.COPY_CLASH * np.minimum(offload_s, streamed_s)
    link_s = streamed_s + offload_s + clash
    paged_s = _div(expert_disk, r.expert_disk_read or r.disk_read)
    disk_s = _div(disk - expert_disk, r.disk_read) + paged_s  # Rates.disk_seconds
    shared = (p_cpu > 0) & (link > 0) & (not r.unified)
    ram_s = np.where(shared, _div(p_cpu + link, cpu_rate * knobs.RAM_SHARED_HEADROOM), 0.0)
    return np.maximum(np.maximum(np.maximum(gpu_s + cpu_s + (offload_s + clash) + paged_s, link_s), disk_s), ram_s)


def _div(num: np.ndarray, rate) -> np.ndarray:
    """cost._div on arrays: 0 for nothing to move, inf without a rate."""
    if rate is None or (np.isscalar(rate) and not rate):
        return np.where(num > 0, np.inf, 0.0)
    rate = np.asarray(rate, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(num > 0, np.where(rate != 0, num / np.where(rate != 0, rate, 1.0), np.inf), 0.0)


def first_fastest(seconds: np.ndarray) -> list[int]:
    """The prefix the split takes of each row's walk: the first at the least time, as a loop keeping a strictly
    faster one finds it (a NaN never beats the time before it)."""
    fastest = np.argmin(np.where(np.isnan(seconds), np.inf, seconds), axis=1)
    return np.where(np.isnan(seconds[:, 0]), 0, fastest).tolist()
