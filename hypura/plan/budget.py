"""Budgets and rates for a plan: from a machine profile, minus safety margins, with user overrides. The one
place the budgets asked for (gpu_mem, ram: "8GiB") are parsed and checked."""

from __future__ import annotations

from dataclasses import dataclass

from hypura.errors import HypuraError
from hypura.plan import knobs
from hypura.plan.cost import Rates
from hypura.profile.machine import MachineProfile
from hypura.sizes import fmt_size, parse_size  # noqa: F401  (re-exported: budgets are sizes)

@dataclass(frozen=True)
class Budgets:
    """Bytes a plan may hold per tier. Unified memory: GPU bytes live in RAM and count there too."""

    gpu: int
    ram: int
    unified: bool = False
    disk: bool = True  # may stream weights from disk

    def __post_init__(self):
        if self.gpu < 0 or self.ram < 0:
            raise HypuraError(f"budgets must not be negative (gpu {self.gpu}, ram {self.ram})")


def budgets_for(profile: MachineProfile, gpu_mem: str | int | None = None, ram: str | int | None = None,
                disk: bool = True) -> Budgets:
    """Defaults: free memory minus margins (knobs.GPU_MARGIN, knobs.RAM_MARGIN); explicit sizes win."""
    gpu = profile.gpu
    if gpu_mem is not None:
        g = parse_size(gpu_mem)
        if g > 0 and gpu is None:
            raise HypuraError("--gpu-mem given but the profile has no GPU")
    else:
        g = max(0, gpu.mem_free - knobs.GPU_MARGIN) if gpu else 0
    r = parse_size(ram) if ram is not None else max(0, profile.host.ram_available - knobs.RAM_MARGIN)
    return Budgets(gpu=g, ram=r, unified=bool(gpu and gpu.unified), disk=disk)


def check_budgets(gpu_mem, ram, free) -> None:
    """A budget larger than the machine has (`free`: hypura.profile.free.FreeMemory) is a mistake, not a plan: one
    line with both figures."""
    if ram is not None and parse_size(ram) > free.ram_total:
        raise HypuraError(f"--ram {ram} is more than this machine has: {fmt_size(free.ram_total)} of RAM"
                          f" ({fmt_size(free.ram)} available now)")
    if gpu_mem is not None and parse_size(gpu_mem) > 0:
        if free.gpu_total is None:
            raise HypuraError(f"--gpu-mem {gpu_mem} given, but this llama.cpp build sees no GPU")
        if parse_size(gpu_mem) > free.gpu_total:
            raise HypuraError(f"--gpu-mem {gpu_mem} is more than the GPU has: {fmt_size(free.gpu_total)}"
                              f" ({fmt_size(free.gpu or 0)} free now)")


def host_ram(ram: str | int | None, free_ram: int) -> int:
    """The host's RAM budget of a split over devices: as given, else what is free (free_ram) less the margin."""
    return parse_size(ram) if ram is not None else max(0, free_ram - knobs.RAM_MARGIN)


def per_gpu(gpu_mem: str | int | None, n_gpus: int) -> list[int] | None:
    """A budget for each of `n_gpus` GPUs (the split over devices): "SIZE,SIZE,..." one each, one size each GPU's."""
    if gpu_mem is None:
        return None
    sizes = [parse_size(m) for m in str(gpu_mem).split(",")]
    return sizes * n_gpus if len(sizes) == 1 else sizes


@dataclass(frozen=True)
class RateOverrides:
    """Hand-given rates in GB/s (decimal), replacing the profile's: plan for a machine you describe."""

    gpu_bw: float | None = None
    cpu_bw: float | None = None
    link_bw: float | None = None
    disk_bw: float | None = None
    no_gpu: bool = False


# more concurrent readers only for a real gain: each costs a request buffer of RAM, and a few per cent between
# thread counts is the probe's noise (1.68, 1.69 and 1.76 GB/s at 1, 2 and 4 threads on one disk)
READERS_GAIN = 1.10


def disk_readers(by_threads) -> int:
    """The fewest concurrent O_DIRECT readers within READERS_GAIN of the fastest thread count measured."""
    if not by_threads:
        return 1
    best = max(bw for _, bw in by_threads)
    return min(t for t, bw in by_threads if bw * READERS_GAIN >= best)


def rates_for(profile: MachineProfile, o: RateOverrides = RateOverrides()) -> Rates:
    gpu = None if o.no_gpu else profile.gpu
    pick = lambda given, measured: given * 1e9 if given else measured  # noqa: E731
    readers = disk_readers(profile.disk.by_threads)
    # a given disk rate stands for both kinds of reads; an older profile measured no random ones
    experts = pick(o.disk_bw, profile.disk.random_read_bw or None)
    # a given CPU rate stands for both layouts
    plain = None if o.cpu_bw else profile.cpu.decode_bw_plain
    if gpu is None:
        return Rates(cpu_read=pick(o.cpu_bw, profile.cpu.decode_bw), disk_read=pick(o.disk_bw, profile.disk.read_bw),
                     cpu_flops=profile.cpu.prefill_flops, disk_readers=readers, expert_disk_read=experts,
                     cpu_read_plain=plain, cpu_batch_gain=profile.cpu.batch_gain)
    # a discrete GPU is fed over the link from pinned memory; unified memory: a RAM copy
    link = profile.host.ram_copy_bw if gpu.unified else (gpu.h2d_pinned_bw or gpu.h2d_pageable_bw)
    return Rates(
        cpu_read=pick(o.cpu_bw, profile.cpu.decode_bw), disk_read=pick(o.disk_bw, profile.disk.read_bw),
        cpu_flops=profile.cpu.prefill_flops, gpu_read=pick(o.gpu_bw, gpu.decode_bw),
        # the model's own prompt rate where the profile timed it on its blocks (profile/gpu_compute.py)
        link=pick(o.link_bw, link), gpu_flops=profile.cpu.gpu_prefill_flops or gpu.prefill_flops, unified=gpu.unified,
        disk_readers=readers,
        expert_disk_read=experts, pageable_link=None if gpu.unified else gpu.h2d_pageable_bw, cpu_read_plain=plain,
        cpu_batch_gain=profile.cpu.batch_gain,
    )
