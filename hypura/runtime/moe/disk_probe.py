"""What the disk gives a decode's expert reads now: bursts of one layer's disk experts, read through the
pager's own ReadPipeline (its readers, staging and copy out) and waited for one by one, as a decode's
layers wait for theirs.

Why: on the H200 the disk's O_DIRECT rate drifted 0.8-2.1 GB/s within an hour (2026-12-03), and small
random expert reads run slower than the profile's sequential 4 MiB requests. A bound from the profile,
taken minutes before, cannot tell a slow runtime from a slow disk; a probe beside the run can.
"""

from __future__ import annotations

import time
from typing import Callable

from hypura.runtime.placement import TensorInfo
from hypura.runtime.read_pipeline import ReadPipeline, Sink


def scratch_sink(nbytes: int) -> Sink:
    """A sink that copies every piece (at most nbytes) into one scratch buffer: the bytes are read, then dropped."""
    scratch = memoryview(bytearray(nbytes))

    def sink(piece: memoryview, _pos: int) -> None:
        scratch[:len(piece)] = piece
    return sink


def burst_rate(reads: ReadPipeline, next_burst: Callable[[], list[TensorInfo]], seconds: float) -> dict:
    """Read bursts from next_burst() until `seconds` passed (at least one): bytes over time. Every piece is
    copied into one scratch buffer, so the probe costs no more memory than a request."""
    sink = scratch_sink(reads.request)
    bursts = nbytes = 0
    t0 = time.perf_counter()
    while True:
        parts = next_burst()
        reads.run([(part, sink) for part in parts])
        bursts += 1
        nbytes += sum(part.nbytes for part in parts)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return {"gbps": nbytes / elapsed / 1e9, "bytes": nbytes, "seconds": elapsed, "bursts": bursts}
