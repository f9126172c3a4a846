"""Faults injected into a subprocess's reads of one file (eio_shim.c, LD_PRELOADed), the budgets that force a
plan onto the disk, what a process holds (/proc) before and after a fault, and a server subprocess's start and
stop."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import pytest

SHIM_SOURCE = Path(__file__).parent / "eio_shim.c"
MiB = 1 << 20


def build_shim(folder: Path) -> Path:
    """eio_shim.c built with the system C compiler ($CC, else cc); skipped without one, failed under CI."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the EIO shim interposes glibc's reads through LD_PRELOAD: Linux only")
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        message = "no C compiler ($CC or cc) to build tests/eio_shim.c, which injects read faults"
        pytest.fail(message) if os.environ.get("CI") == "true" else pytest.skip(message)
    out = folder / "eio_shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(SHIM_SOURCE), "-ldl"], check=True,
                   capture_output=True, timeout=120)
    return out


def faulted_env(shim: Path, path: Path, after: int = 0, start: int = 0, trigger: Optional[Path] = None,
                fired: Optional[Path] = None) -> dict:
    """The environment of a process whose reads of `path` fail with EIO once `after` bytes of it were read,
    at byte `start` of it and past, and (with a trigger) while `trigger` exists; `fired` is made at the first."""
    env = {**os.environ, "LD_PRELOAD": str(shim), "EIO_SHIM_FILE": str(path), "EIO_SHIM_AFTER": str(after),
           "EIO_SHIM_FROM": str(start)}
    env.update({k: str(v) for k, v in (("EIO_SHIM_TRIGGER", trigger), ("EIO_SHIM_FIRED", fired)) if v})
    return env


def budget(path: Path, n_ctx: int, wanted: Callable) -> str:
    """The smallest whole-MiB --ram, from the model's floor up, whose CPU plan at `n_ctx` is `wanted(plan)`."""
    from hypura.modelfile import read_header
    from hypura.plan import PlanSettings, budgets_for, model_units, plan_model, rates_for
    from hypura.plan.search import ram_floor
    from hypura.profile import machine_profile

    profile, settings = machine_profile(), PlanSettings(n_ctx=n_ctx)
    floor = ram_floor(model_units(read_header(path)), budgets_for(profile, 0, "1GiB"), rates_for(profile), settings)
    for mib in range(-(-floor // MiB), floor // MiB + 16):
        if wanted(plan_model(path, profile, gpu_mem=0, ram=mib * MiB, settings=settings)):
            return f"{mib}MiB"
    raise AssertionError(f"no --ram within 16 MiB of {path.name}'s floor plans it as wanted")


def streams_layers(plan) -> bool:
    """Dense layers read from disk at every token (fewer slots than layers), no expert paged."""
    from hypura.runtime.moe.expert_paging import paged_tensors
    from hypura.runtime.plan_policy import plan_layout

    layout = plan_layout(plan)
    return any(len(layout.layers(pool)) > n for pool, n in layout.slots.items()) and not paged_tensors(plan)


def pages_experts(plan) -> bool:
    """Experts read from disk when selected, no dense layer streamed."""
    from hypura.runtime.moe.expert_paging import paged_tensors
    from hypura.runtime.plan_policy import plan_layout

    return bool(paged_tensors(plan)) and not plan_layout(plan).tensors


def change_file(path: Path, how: str) -> None:
    """The file 'truncated' to half, or 'written' in place (the same bytes back: changed all the same)."""
    size = path.stat().st_size
    if how == "truncated":
        os.truncate(path, size // 2)  # the later layers' pages go
        return
    with open(path, "r+b") as f:
        f.seek(size - (64 << 10))
        data = f.read(4096)
        f.seek(size - (64 << 10))
        f.write(data)
    os.utime(path, ns=(0, 1))  # a write within the clock's tick still moves the stamp


def replace_file(path: Path, data: bytes) -> None:
    """`path` replaced by `data` as a copy lands: written beside it, renamed over it (a new inode)."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_bytes(data)
    os.replace(fresh, path)


def held(pid: int) -> tuple[int, int, int]:
    """(RSS bytes, open descriptors, threads) of process `pid`."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


def one_error_line(rc: int, err: str, name: str) -> str:
    """A CLI that failed cleanly: status 1, no traceback or abort, one 'error:' line naming the file."""
    assert rc == 1, f"status {rc}:\n{err[-3000:]}"
    for crash in ("Traceback", "GGML_ASSERT", "Aborted", "core dumped", "terminate called"):
        assert crash not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and name in lines[0], err[-3000:]
    return lines[0]
