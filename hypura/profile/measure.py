"""`hypura profile`'s measurement: host, accelerators, storage, CPU compute; cached per machine."""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from hypura.errors import HypuraError
from hypura.profile import compute, knobs
from hypura.profile.disk import measure_disk, measure_file
from hypura.profile.host import cores, cpu_name, ram_copy_bw
from hypura.profile.model import GpuInfo, HostInfo, MachineProfile
from hypura.profile.store import cache_path, gpu_devices, hardware_facts, load_cached, profile_key


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _gpu_info(dev, progress: Callable[[str], None]) -> GpuInfo:
    from hypura.profile.devices import measure_links

    progress(f"  {dev.description}: host->device (pinned, pageable) and device copy, {knobs.LINK_BYTES >> 20} MiB")
    links = measure_links(dev.index)
    return GpuInfo(
        index=dev.index, name=dev.name, description=dev.description, mem_total=dev.mem_total,
        mem_free=dev.mem_free, unified=dev.unified, h2d_pinned_bw=links.h2d_pinned_bw,
        h2d_pageable_bw=links.h2d_pageable_bw, d2d_bw=links.d2d_bw,
        decode_bw=links.d2d_bw * knobs.GPU_READ_EFFICIENCY, prefill_flops=knobs.GPU_FLOPS_DEFAULT,
        method=(f"links measured; decode rate = device copy x {knobs.GPU_READ_EFFICIENCY} and prefill "
                f"{knobs.GPU_FLOPS_DEFAULT / 1e12:.0f} TFLOP/s from the planner's fit to vanilla llama.cpp's H200 runs"),
    )


def measure_profile(path: str | os.PathLike | None = None, model: str | os.PathLike | None = None,
                    progress: Callable[[str], None] = _stderr,
                    disk_file: str | os.PathLike | None = None) -> MachineProfile:
    """disk_file: a large file (the model to run) whose disk is measured by reading it, in place of a
    test file written in `path`."""
    t0 = time.perf_counter()
    notes: list[str] = []
    progress("[1/4] host: RAM copy bandwidth")
    physical, logical = cores()
    vm = psutil.virtual_memory()
    copy_bw = ram_copy_bw()
    gpus, why = gpu_devices()
    facts = hardware_facts(gpus)
    host = HostInfo(dict(facts)["hostname"], cpu_name(), physical, logical, vm.total, vm.available, copy_bw)
    progress(f"      {copy_bw / 1e9:.1f} GB/s")

    progress(f"[2/4] accelerators: {len(gpus)} GPU(s)" + (f" ({why})" if why else ""))
    gpu_infos = tuple(_gpu_info(d, progress) for d in gpus)
    if not gpus:
        notes.append("no GPU: CPU-only plans (RAM-resident vs disk-streamed, CPU compute)")

    folder = Path(path or os.environ.get("HYPURA_MODELS") or Path.cwd())
    big = disk_file is not None and Path(disk_file).stat().st_size >= knobs.DISK_FILE_MIN_BYTES
    progress(f"[3/4] storage: O_DIRECT reads {f'of {disk_file}' if big else f'in {folder}'}")
    disk = None
    if big:
        try:
            disk = measure_file(disk_file, progress=lambda m: progress(f"      {m}"))
        except HypuraError as e:  # e.g. a filesystem without O_DIRECT: a test file says what it does instead
            progress(f"      {e}; a test file in {folder} instead")
    disk = disk or measure_disk(folder, progress=lambda m: progress(f"      {m}"))
    if not disk.direct_io or disk.fs_type in ("tmpfs", "ramfs"):
        notes.append(f"disk figure is not a storage figure: {disk.method}" if disk.fs_type in ("tmpfs", "ramfs")
                     else f"disk: {disk.method}")

    progress("[4/4] CPU compute: a short llama.cpp run")
    try:
        from hypura.models import default_model_path

        cpu = compute.measure_llama(Path(model) if model else default_model_path(), physical)
    except (HypuraError, ImportError, OSError, ValueError, RuntimeError) as e:
        cpu = compute.proxy(copy_bw, physical, str(e))
        notes.append(f"CPU decode rate is a proxy: {e}")
    progress(f"      decode reads {cpu.decode_bw / 1e9:.1f} GB/s of weights")
    return MachineProfile(
        key=profile_key(facts), hardware=facts,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        seconds=round(time.perf_counter() - t0, 2), host=host, disk=disk, cpu=cpu, gpus=gpu_infos, notes=tuple(notes),
    )


def get_profile(force: bool = False, path: str | os.PathLike | None = None, model: str | os.PathLike | None = None,
                progress: Callable[[str], None] = _stderr,
                disk_file: str | os.PathLike | None = None) -> tuple[MachineProfile, Path, bool]:
    """(profile, cache file, measured now): the cached one unless forced, stale or missing."""
    facts = hardware_facts()
    cached = None if force else load_cached(facts)
    if cached is not None and path and Path(path).resolve() != Path(cached.disk.path):
        cached = None  # another filesystem than the one measured
    if cached is not None:
        return cached, cache_path(cached.key), False
    profile = measure_profile(path, model, progress, disk_file)
    return profile, profile.save(cache_path(profile.key)), True


def planning_profile(model_path: str | os.PathLike | None = None, say: Callable[[str], None] | None = _stderr,
                     measure: bool = True) -> MachineProfile:
    """The profile a plan is made with: this machine's cached one; without one, measured now on the model's
    disk (briefly, with progress through `say`, and cached), so that a first plan has this machine's rates
    rather than defaults (a PCIe 4.0 link for an H200's PCIe 5.0 one); the defaults when that fails or
    `measure` is False."""
    from hypura.profile.store import quick_profile

    cached = load_cached()
    if cached is not None or not measure:
        return cached or quick_profile()
    folder = Path(model_path).resolve().parent if model_path else None
    say = say or (lambda msg: None)
    say(f"hypura: no machine profile yet: measuring {f'the model disk ({folder}), ' if folder else ''}"
        "RAM and the CPU (once, ~20 s)")
    try:
        return get_profile(path=folder, progress=lambda msg: say(f"hypura: profile {msg}"), disk_file=model_path)[0]
    except HypuraError as e:
        say(f"hypura: profile not measured ({e}): planning with default rates")
        return quick_profile()
