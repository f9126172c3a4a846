"""Free memory now: what a plan on the default path may take (hypura/plan/auto.py).

GPU: the first GPU's free memory as ggml reports it (ggml_backend_dev_memory, other processes' use
counted). RAM: psutil's available memory, capped by the memory cgroup this process runs in (v2:
memory.max - memory.current + reclaimable file pages of every enclosing cgroup; v1: limit_in_bytes -
usage_in_bytes), since a container's limit binds long before the host's RAM does.

$HYPURA_FREE_MEMORY replaces the measurement, e.g. "gpu=8GiB,ram=6GiB" (a part left out is measured;
gpu=0 plans as if there were no free GPU memory; naming both measures nothing, only the totals are
read): read once, at import, for tests and for planning as if other programs held memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from hypura.errors import HypuraError
from hypura.sizes import fmt_size, parse_size

ENV = "HYPURA_FREE_MEMORY"
OVERRIDE = os.environ.get(ENV)  # read once


@dataclass(frozen=True)
class FreeMemory:
    gpu: int | None  # bytes free on the first GPU; None: no GPU
    ram: int  # bytes this process may still take
    gpu_total: int | None
    ram_total: int  # the machine's RAM, or its cgroup's limit when lower
    source: str = "measured"

    def describe(self) -> str:
        gpu = f"GPU {fmt_size(self.gpu)} free, " if self.gpu is not None else ""
        return f"{gpu}RAM {fmt_size(self.ram)} available" + ("" if self.source == "measured" else f" ({self.source})")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def _file_pages(stat: Path) -> int:
    """Page cache the kernel reclaims before the cgroup's limit bites (inactive file pages)."""
    try:
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("inactive_file", "total_inactive_file"):
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_limit(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) \
        -> tuple[int, int] | None:
    """(limit, bytes still available under it) of the tightest memory cgroup holding this process."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the limit of every ancestor applies
            d = root / path.lstrip("/")
            while True:
                limit = _read_int(d / "memory.max")
                used = _read_int(d / "memory.current")
                if limit is not None and used is not None:
                    left = max(0, limit - used + _file_pages(d / "memory.stat"))
                    if best is None or left < best[1]:
                        best = (limit, left)
                if d == root or root not in d.parents:
                    break
                d = d.parent
        elif "memory" in controllers.split(","):  # v1
            d = root / "memory" / path.lstrip("/")
            for folder in (d, root / "memory"):
                limit = _read_int(folder / "memory.limit_in_bytes")
                used = _read_int(folder / "memory.usage_in_bytes")
                # an unlimited v1 cgroup reports a page-rounded 2^63
                if limit is not None and used is not None and limit < 1 << 60:
                    left = max(0, limit - used + _file_pages(folder / "memory.stat"))
                    if best is None or left < best[1]:
                        best = (limit, left)
                    break
    return best


def _first_gpu() -> tuple[int, int] | None:
    try:
        from hypura.profile.devices import local_gpus

        gpus = local_gpus()
    except (HypuraError, OSError):
        return None  # no library yet: no GPU this process could use
    return (gpus[0].mem_free, gpus[0].mem_total) if gpus else None


def measure() -> FreeMemory:
    """The live probe: what other programs leave free now."""
    vm = psutil.virtual_memory()
    ram, total = vm.available, vm.total
    cg = cgroup_limit()
    if cg is not None:
        total, ram = min(total, cg[0]), min(ram, cg[1])
    gpu = _first_gpu()
    return FreeMemory(gpu[0] if gpu else None, ram, gpu[1] if gpu else None, total)


def totals() -> FreeMemory:
    """The machine's sizes without the live probe (ram and gpu hold the totals): facts, not load."""
    cg = cgroup_limit()
    total = min(psutil.virtual_memory().total, cg[0]) if cg else psutil.virtual_memory().total
    gpu = _first_gpu()
    return FreeMemory(gpu[1] if gpu else None, total, gpu[1] if gpu else None, total, source="totals")


def _override_parts(text: str) -> dict[str, int]:
    parts = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in ("gpu", "ram"):
            raise HypuraError(f"${ENV}={text!r}: expected e.g. gpu=8GiB,ram=6GiB")
        parts[key] = parse_size(value)
    return parts


def parse_override(text: str, measured: FreeMemory) -> FreeMemory:
    parts = _override_parts(text)
    gpu = parts.get("gpu", measured.gpu)
    if gpu is not None and measured.gpu is None and gpu > 0:
        raise HypuraError(f"${ENV} gives GPU memory, but this llama.cpp build has no GPU")
    gpu_total = measured.gpu_total if measured.gpu_total is not None else gpu
    return FreeMemory(gpu=None if measured.gpu is None else gpu, ram=parts.get("ram", measured.ram),
                      gpu_total=gpu_total, ram_total=measured.ram_total, source=f"${ENV}")


def free_memory() -> FreeMemory:
    """What this machine has free now ($HYPURA_FREE_MEMORY in place of the measurement)."""
    if not OVERRIDE:
        return measure()
    return parse_override(OVERRIDE, totals() if len(_override_parts(OVERRIDE)) == 2 else measure())
