"""`hypura profile`'s measurement: host, accelerators, storage, CPU compute; cached per machine."""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from hypura.errors import HypuraError
from hypura.profile import apart, compute, measure_knobs as knobs
from hypura.profile.disk import measure_disk, measure_file
from hypura.profile import host
from hypura.profile.host import cores, cpu_name
from hypura.modelfile import read_header
from hypura.profile.machine import CpuCompute, GpuInfo, HostInfo, MachineProfile
from hypura.profile.store import (cache_dir, cache_path, gpu_devices, hardware_facts, load_cached, load_model_cpu,
                                  model_mix, profile_key, save_model_cpu)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ram_copy_bw() -> float:
    """host.ram_copy_bw apart (apart.py): its two 256 MiB buffers never count in the caller's RSS peak."""
    return apart.call(host.ram_copy_bw)


def _gpu_info(dev, progress: Callable[[str], None]) -> GpuInfo:
    from hypura.profile.devices import Links, measure_links

    progress(f"  {dev.description}: host->device (pinned, pageable) and device copy, {knobs.LINK_BYTES >> 20} MiB")
    links = Links(**apart.call(measure_links, dev.index))  # apart: 1 GiB pinned and 1 GiB pageable
    return GpuInfo(
        index=dev.index, name=dev.name, description=dev.description, mem_total=dev.mem_total,
        mem_free=dev.mem_free, unified=dev.unified, h2d_pinned_bw=links.h2d_pinned_bw,
        h2d_pageable_bw=links.h2d_pageable_bw, d2d_bw=links.d2d_bw,
        decode_bw=links.d2d_bw * knobs.GPU_READ_EFFICIENCY, prefill_flops=knobs.GPU_FLOPS_DEFAULT,
        method=(f"links measured; decode rate = device copy x {knobs.GPU_READ_EFFICIENCY} and prefill "
                f"{knobs.GPU_FLOPS_DEFAULT / 1e12:.0f} TFLOP/s from the planner's fit to vanilla llama.cpp's H200 runs"),
    )


def _with_peers(gpus: tuple[GpuInfo, ...], progress: Callable[[str], None]) -> tuple[GpuInfo, ...]:
    """Several GPUs: each one's copy rate to every other (a layer split hands activations between them)."""
    if len(gpus) < 2:
        return gpus
    from hypura.profile.devices import measure_peer

    progress(f"  GPU to GPU copies, {knobs.PEER_BYTES >> 20} MiB, {len(gpus) * (len(gpus) - 1)} pairs")
    return tuple(dataclasses.replace(g, peer_bw=tuple((o.index, apart.call(measure_peer, g.index, o.index))
                                                      for o in gpus if o is not g)) for g in gpus)


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
    gpu_infos = _with_peers(tuple(_gpu_info(d, progress) for d in gpus), progress)
    if not gpus:
        notes.append("no GPU: CPU-only plans (RAM-resident vs disk-streamed, CPU compute)")

    folder = Path(path or os.environ.get("HYPURA_MODELS") or Path.cwd())
    big = disk_file is not None and Path(disk_file).stat().st_size >= knobs.DISK_FILE_MIN_BYTES
    if disk_file is not None and not big:
        folder = cache_dir()  # nothing is ever written beside a model (an Ollama store's blobs, a read-only folder)
        folder.mkdir(parents=True, exist_ok=True)
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

    progress("[4/4] CPU compute: llama.cpp on a few of the model's blocks")
    key = profile_key(facts)
    try:
        cpu = _measure_cpu(key, Path(model) if model else _default_model(), physical,
                           progress=lambda m: progress(f"      {m}"))
    except (HypuraError, ImportError, OSError, ValueError, RuntimeError) as e:
        cpu = compute.proxy(copy_bw, physical, str(e))
        notes.append(f"CPU decode rate is a proxy: {e}")
        progress(f"      decode reads {cpu.decode_bw / 1e9:.1f} GB/s of weights (a proxy: {e})")
    return MachineProfile(
        key=key, hardware=facts,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        seconds=round(time.perf_counter() - t0, 2), host=host, disk=disk, cpu=cpu, gpus=gpu_infos, notes=tuple(notes),
    )


def _default_model() -> Path:
    from hypura.models import default_model_path

    return default_model_path()


def model_cpu(key: str, model: Path, threads: int, measure: bool = True,
              progress: Callable[[str], None] = lambda _: None) -> CpuCompute | None:
    """The CPU's rates on `model`'s blocks at `threads` on the machine of profile `key`: cached, else measured
    now (and cached) when `measure`, else None."""
    cpu = load_model_cpu(key, _mix(model, threads))
    if cpu is None and measure:
        cpu = _measure_cpu(key, model, threads, progress)
    return cpu


def _mix(model: Path, threads: int) -> str:
    return model_mix(read_header(model), threads)


def _measure_cpu(key: str, model: Path, threads: int, progress: Callable[[str], None]) -> CpuCompute:
    cpu = compute.measure_model(model, threads, cache_dir(), progress)
    save_model_cpu(key, _mix(model, threads), cpu)
    return cpu


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
    """The profile a plan for `model_path` is made with: this machine's cached one, without one measured now on
    the model's disk (briefly, with progress through `say`, and cached), so that a first plan has this machine's
    rates rather than defaults (a PCIe 4.0 link for an H200's PCIe 5.0 one); the defaults when that fails or
    `measure` is False. Its CPU rates are the model's own (model_cpu), measured now if need be."""
    from hypura.profile.store import PINNED, quick_profile

    say = say or (lambda msg: None)
    profile = load_cached()
    if profile is None and measure:
        folder = Path(model_path).resolve().parent if model_path else None
        say(f"hypura: no machine profile yet: measuring {f'the model disk ({folder}), ' if folder else ''}"
            "RAM, GPU links and the CPU on the model's blocks (once: other models reuse all but the CPU's rate)")
        try:
            profile = get_profile(path=folder, model=model_path, disk_file=model_path,
                                  progress=lambda msg: say(f"hypura: profile {msg}"))[0]
        except HypuraError as e:
            say(f"hypura: profile not measured ({e}): planning with default rates")
    profile = profile or quick_profile()
    if model_path is None or PINNED:
        return profile  # a pinned profile ($HYPURA_PROFILE) stands for the machine, its CPU rates included
    try:
        cpu = model_cpu(profile.key, Path(model_path), cores()[0], measure,
                        progress=lambda msg: say(f"hypura: profile of the CPU on this model: {msg}"))
    except (HypuraError, OSError, ValueError, RuntimeError) as e:
        say(f"hypura: the CPU's rate on this model not measured ({e}): planning with the profile's")
        return profile
    return dataclasses.replace(profile, cpu=cpu) if cpu is not None else profile
