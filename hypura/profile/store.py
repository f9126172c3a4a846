"""Where profiles live: the user cache, keyed by host and devices; bundled examples; a quick
unmeasured profile for planning before `hypura profile` ever ran.

The cache file is `${XDG_CACHE_HOME:-~/.cache}/hypura/profile-<hostname>-<hash>.json`, the hash over
the hardware facts (CPU, RAM size, GPUs and their memory). A cached profile whose facts differ from
the machine's now is stale and is measured again. The CPU's rates depend on the model too (its tensor
types and shapes) and on the threads: each model mix measured has its own file beside the profile,
`cpu-<hostname>-<hash>-<mix hash>.json`. $HYPURA_PROFILE (a profile file, or a bundled example's name)
stands in for the cached profile, read once, at import: to plan as another machine would, and for
tests, whose plans must not follow the machine they run on.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
from pathlib import Path

import psutil

from hypura.errors import HypuraError
from hypura.cachefile import read_cache, write_atomic
from hypura.jsonfile import parse_json
from hypura.profile import measure_knobs as knobs
from hypura.profile.host import cores, cpu_name, host_facts
from hypura.profile.machine import CpuCompute, DiskInfo, GpuInfo, HostInfo, MachineProfile, load_profile

EXAMPLES_DIR = Path(__file__).parent / "examples"
PROFILE_ENV = "HYPURA_PROFILE"
PINNED = os.environ.get(PROFILE_ENV)  # read once


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hypura"


def gpu_devices() -> tuple[list, str]:
    """(GPU devices, why none): devices come from our libllama, absent before ./build.sh."""
    try:
        from hypura.profile.devices import local_gpus

        return local_gpus(), ""
    except (HypuraError, OSError) as e:
        return [], f"no device list ({e})"


def hardware_facts(gpus: list | None = None) -> tuple[tuple[str, str], ...]:
    if gpus is None:
        gpus, why = gpu_devices()
    else:
        why = ""
    facts = host_facts()
    facts["gpus"] = "; ".join(f"{g.description} {round(g.mem_total / knobs.GiB)} GiB" for g in gpus) or why or "none"
    return tuple(sorted(facts.items()))


def profile_key(facts: tuple[tuple[str, str], ...]) -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", dict(facts).get("hostname", "host"))
    digest = hashlib.sha1(json.dumps(facts).encode()).hexdigest()[:10]
    return f"{host}-{digest}"


def cache_path(key: str) -> Path:
    return cache_dir() / f"profile-{key}.json"


def load_cached(facts: tuple[tuple[str, str], ...] | None = None) -> MachineProfile | None:
    """This machine's cached profile ($HYPURA_PROFILE in its place), or None when there is none or it is stale."""
    if PINNED:
        return resolve_profile(PINNED)
    facts = facts if facts is not None else hardware_facts()
    profile = read_cache(cache_path(profile_key(facts)), "machine profile",
                         lambda data: MachineProfile.from_dict(parse_json(data, "the file")))
    return profile if profile is not None and profile.hardware == facts else None


def model_mix(header, threads: int) -> str:
    """What a CPU measurement on `header`'s model stands for: its tensors' types and shapes (the same for every
    model of that architecture, size and quantization), the experts a token uses, the threads."""
    tensors = [(t.name, int(t.ggml_type), list(t.shape)) for t in header.tensors]
    facts = [header.arch, int(header.get("expert_used_count", 0) or 0), threads, tensors]
    return hashlib.sha1(json.dumps(facts).encode()).hexdigest()[:10]


def cpu_cache_path(key: str, mix: str) -> Path:
    return cache_dir() / f"cpu-{key}-{mix}.json"


def load_model_cpu(key: str, mix: str) -> CpuCompute | None:
    """The CPU's rates measured on this machine (profile key) for this model mix, None when not measured."""
    def parse(data: bytes) -> CpuCompute | None:
        d = parse_json(data, "the file")
        # a file from before batched steps and the GPU's prompts were timed: measured again (a few seconds, once)
        return CpuCompute(**d) if "batch_gain" in d and "gpu_prefill_flops" in d else None

    return read_cache(cpu_cache_path(key, mix), "CPU profile", parse)


def save_model_cpu(key: str, mix: str, cpu: CpuCompute) -> Path:
    return write_atomic(cpu_cache_path(key, mix), json.dumps(dataclasses.asdict(cpu), indent=2) + "\n")


def example_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES_DIR.glob("*.json"))


def resolve_profile(spec: str | os.PathLike) -> MachineProfile:
    """A profile file, or the name of a bundled example (`m1-max-32gb`)."""
    path = Path(spec)
    if not path.is_file() and (EXAMPLES_DIR / f"{spec}.json").is_file():
        path = EXAMPLES_DIR / f"{spec}.json"
    if not path.is_file():
        raise HypuraError(f"profile {spec}: no such file (bundled examples: {', '.join(example_names())})")
    return load_profile(path)


def quick_profile() -> MachineProfile:
    """Capacities measured now (instant), rates from defaults: for plans before any `hypura profile`."""
    gpus, why = gpu_devices()
    facts = hardware_facts(gpus)
    physical, logical = cores()
    vm = psutil.virtual_memory()
    unmeasured = "default (not measured): run `hypura profile`"
    gpu_infos = tuple(GpuInfo(
        index=g.index, name=g.name, description=g.description, mem_total=g.mem_total, mem_free=g.mem_free,
        unified=g.unified, h2d_pinned_bw=knobs.DEFAULT_LINK_BW, h2d_pageable_bw=None, d2d_bw=None,
        decode_bw=knobs.DEFAULT_GPU_DECODE_BW, prefill_flops=knobs.GPU_FLOPS_DEFAULT, method=unmeasured)
        for g in gpus)
    return MachineProfile(
        key=profile_key(facts), hardware=facts,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), seconds=0.0,
        host=HostInfo(dict(facts)["hostname"], cpu_name(), physical, logical, vm.total, vm.available,
                      ram_copy_bw=knobs.DEFAULT_CPU_DECODE_BW),
        disk=DiskInfo(path="", fs_type="unknown", direct_io=False, method=unmeasured,
                      request_bytes=knobs.DISK_REQUEST_BYTES, read_bw=knobs.DEFAULT_DISK_BW),
        cpu=CpuCompute(knobs.DEFAULT_CPU_DECODE_BW, knobs.CPU_FLOPS_DEFAULT, physical, unmeasured),
        gpus=gpu_infos, notes=("quick profile: rates are defaults, not measurements",) + ((why,) if why else ()),
    )


def machine_profile(spec: str | os.PathLike | None = None) -> MachineProfile:
    """What planning uses: the named file/example, else this machine's cached profile, else a quick one."""
    if spec:
        return resolve_profile(spec)
    return load_cached() or quick_profile()
