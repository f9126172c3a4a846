"""The host: CPU, RAM (psutil) and how fast it copies memory."""

from __future__ import annotations

import platform
import socket
import time

import numpy as np
import psutil

from hypura.profile import measure_knobs as knobs


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_facts() -> dict[str, str]:
    """What identifies this host's hardware (stable across reboots; changes when hardware does)."""
    return {
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "threads": str(psutil.cpu_count(logical=True)),
        "ram_gib": str(round(psutil.virtual_memory().total / knobs.GiB)),
    }


def ram_copy_bw(nbytes: int = knobs.RAM_COPY_BYTES, repeats: int = knobs.RAM_COPY_REPEATS) -> float:
    """Bytes copied per second by numpy.copyto (one thread, like a staging memcpy), best of a few."""
    src = np.full(nbytes, 1, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch: page faults are not bandwidth
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def cores() -> tuple[int, int]:
    logical = psutil.cpu_count(logical=True) or 1
    return psutil.cpu_count(logical=False) or logical, logical
