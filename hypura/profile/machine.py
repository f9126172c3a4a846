"""A machine profile: what `hypura profile` measured, as frozen dataclasses with a JSON form.

Bandwidths are bytes/s, compute rates FLOP/s, memory bytes. Each measured section says how it was
measured (`method`), so a figure from a proxy or a default is never mistaken for a measurement.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypura.errors import HypuraError
from hypura.cachefile import write_atomic
from hypura.jsonfile import parse_json, read_json_file

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    cpu: str  # model name
    cores: int  # physical
    threads: int  # logical
    ram_total: int
    ram_available: int  # at measurement time (psutil)
    ram_copy_bw: float  # bytes copied per second by one large memcpy (numpy.copyto)


@dataclass(frozen=True)
class DiskInfo:
    path: str  # where the test file was written
    fs_type: str
    direct_io: bool  # True: O_DIRECT (F_NOCACHE on macOS) reads, the page cache out of the way
    method: str
    request_bytes: int
    read_bw: float  # best over thread counts
    by_threads: tuple[tuple[int, float], ...] = ()  # (threads, bytes/s)
    # random reads at random_request_bytes, as decode reads experts; 0: not measured (an older profile)
    random_request_bytes: int = 0
    random_read_bw: float = 0.0  # best over thread counts
    random_by_threads: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class CpuCompute:
    """llama.cpp on the CPU: weight bytes read per second in decode, FLOP/s in prefill."""

    decode_bw: float
    prefill_flops: float
    threads: int
    method: str
    # decode from weights in ggml's plain layout (pinned host memory, no repacking): where llama.cpp repacks
    # (x86 AVX2/AVX-512, ARM) a plan that holds CPU weights pinned reads them at this rate; None: decode_bw
    decode_bw_plain: float | None = None
    # ((tokens, gain), ...): a decode step of that many tokens ran `gain` times faster than the cost model's sum
    # (plan/cost.py batch_compute_s at decode_bw and prefill_flops) says, on the model's blocks; (): not measured
    batch_gain: tuple[tuple[int, float], ...] = ()
    # FLOP/s of a prompt micro-batch on the GPU, every weight there, on the model's blocks (gpu_compute.py); None:
    # no GPU, or not measured (the GPU's default, GpuInfo.prefill_flops, stands)
    gpu_prefill_flops: float | None = None

    def __post_init__(self):
        # from JSON: lists
        object.__setattr__(self, "batch_gain", tuple((int(k), float(g)) for k, g in self.batch_gain))


@dataclass(frozen=True)
class GpuInfo:
    index: int  # ggml device index
    name: str
    description: str
    mem_total: int
    mem_free: int
    unified: bool  # shares host RAM (Apple silicon, integrated GPUs)
    h2d_pinned_bw: float | None  # ggml_backend_tensor_set from a host-buffer-type allocation
    h2d_pageable_bw: float | None  # ... from ordinary (numpy) memory
    d2d_bw: float | None  # device copy: bytes read + written per second
    decode_bw: float  # weight-read rate of decode on this device
    prefill_flops: float
    method: str
    # ((ggml device index, bytes/s), ...): copies from this GPU straight to another local GPU (peer access);
    # empty with one GPU, or where none was measured
    peer_bw: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class MachineProfile:
    key: str  # hostname + hash of the hardware facts: the cache file's name
    hardware: tuple[tuple[str, str], ...]  # the facts the key hashes; a change makes it stale
    created: str  # ISO 8601
    seconds: float  # time the measurement took
    host: HostInfo
    disk: DiskInfo
    cpu: CpuCompute
    gpus: tuple[GpuInfo, ...] = ()
    notes: tuple[str, ...] = ()
    version: int = SCHEMA_VERSION

    @property
    def gpu(self) -> GpuInfo | None:
        """The GPU plans use (the first; multi-GPU splits are out of scope)."""
        return self.gpus[0] if self.gpus else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> MachineProfile:
        if d.get("version") != SCHEMA_VERSION:
            raise HypuraError(f"profile schema v{d.get('version')} is not v{SCHEMA_VERSION}: run `hypura profile --force`")
        try:
            return cls(
                key=d["key"],
                hardware=tuple((str(k), str(v)) for k, v in d["hardware"]),
                created=d["created"],
                seconds=float(d["seconds"]),
                host=_build(HostInfo, d["host"]),
                disk=_build(DiskInfo, {**d["disk"], **{k: _pairs(d["disk"][k]) for k in _PAIRS if k in d["disk"]}}),
                cpu=_build(CpuCompute, d["cpu"]),
                gpus=tuple(_build(GpuInfo, {**g, "peer_bw": _pairs(g.get("peer_bw", ()))}) for g in d.get("gpus", ())),
                notes=tuple(d.get("notes", ())),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise HypuraError(f"malformed machine profile ({type(e).__name__}: {e})") from None

    @classmethod
    def from_json(cls, text: str) -> MachineProfile:
        return cls.from_dict(parse_json(text, "machine profile"))

    def save(self, path: str | os.PathLike) -> Path:
        return write_atomic(path, self.to_json())


_PAIRS = ("by_threads", "random_by_threads")  # DiskInfo's (threads, bytes/s) lists


def _pairs(rows) -> tuple[tuple[int, float], ...]:
    return tuple((int(t), float(b)) for t, b in rows)


def _build(cls, d: dict[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    missing = {f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING} - d.keys()
    if missing:
        raise KeyError(f"{cls.__name__} lacks {', '.join(sorted(missing))}")
    return cls(**{k: v for k, v in d.items() if k in names})


def load_profile(path: str | os.PathLike) -> MachineProfile:
    d = read_json_file(path, "profile")
    try:
        return MachineProfile.from_dict(d)
    except HypuraError as e:
        raise HypuraError(f"{path}: {e}") from None
