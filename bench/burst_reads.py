"""How fast can the pager's reads go when a layer asks for a few experts and waits? Bursts of B random
expert-sized O_DIRECT reads of FILE through the pager's ReadPipeline (the same readers, stagers and copy
into RAM), each burst waited for before the next, as a decode's layers do; the page cache dropped first.

    python3 bench/burst_reads.py FILE OUT.json READERS [SIZE]      (default SIZE: 0.9 MB, a Qwen expert's tensor)

Why: on the H200 a warm plan reads ~2 experts (6 slices of 0.9 MB) a layer and waits, and the pager's
reads ran at 0.8 GB/s while the profile's 4 MiB requests on 4 threads ran at 1.9 GB/s (2026-12-03). The
bound assumes the latter. Prediction: bursts of 6 reach ~1.1 GB/s and larger bursts approach the disk's
steady rate for this size (~1.6 GB/s): the gap is each burst's ramp and tail, which only reads
issued ahead (prefetch) can fill. Each burst size also runs with the destination faulted in first, as
the pager's evict-and-read cycle does (fresh pages each burst): by the caller between copies, and by
fault-in threads ahead of them (expert_paging.fault_in_threads(): 4 on 16 cores).
"""

import ctypes
import json
import mmap
import os
import random
import statistics
import sys
import time

from hypura.runtime.expert_paging import _MADV_DONTNEED, _MADV_POPULATE_WRITE, _libc_madvise, fault_in_threads
from hypura.runtime.placement import TensorInfo, Tier
from hypura.runtime.read_pipeline import ReadPipeline

TOTAL, BURSTS = 384 << 20, (1, 3, 6, 12, 24, 48)


def burst_rate(pipe: ReadPipeline, path: str, size: int, burst: int, seed: int, fault_in: bool) -> float:
    n = max(burst, TOTAL // size // burst * burst)
    span = os.path.getsize(path) - size
    rng = random.Random(seed)
    offsets = [rng.randrange(0, span) // 32 * 32 for _ in range(n)]  # GGUF aligns tensors to 32 bytes
    dest = mmap.mmap(-1, burst * size)
    anchor = ctypes.c_char.from_buffer(dest)  # holds the mapping's address; released before it closes
    base = ctypes.addressof(anchor)
    madvise = _libc_madvise()

    def sink_at(i):
        def sink(piece, pos):
            dest[i * size + pos:i * size + pos + len(piece)] = piece
        return sink

    def prepare(i):
        if fault_in and madvise is not None:
            madvise(ctypes.c_void_p(base + i * size // 4096 * 4096), ctypes.c_size_t(size // 4096 * 4096),
                    _MADV_POPULATE_WRITE)

    t0 = time.perf_counter()
    for b in range(0, n, burst):
        if fault_in and madvise is not None:  # as an eviction: the next burst lands in fresh pages
            madvise(ctypes.c_void_p(base), ctypes.c_size_t(burst * size // 4096 * 4096), _MADV_DONTNEED)
        parts = [(TensorInfo(name=f"slice {i}", ggml_type=0, shape=(size,), file_offset=offsets[b + i], nbytes=size,
                             file_idx=0, layer=0, default_tier=Tier.HOST, default_buft="CPU"), sink_at(i))
                 for i in range(burst)]
        pipe.run(parts, before_first=prepare)
    rate = n * size / (time.perf_counter() - t0)
    del anchor
    dest.close()
    return rate


def main(path: str, out: str, readers: int, size: int) -> None:
    rows = []
    for fault_in, preparers in ((False, 0), (True, 0), (True, fault_in_threads())):
        pipe = ReadPipeline([path], readers, preparers=preparers)
        mode = (f"fault-in on {preparers} threads" if preparers else
                "fault-in by the caller" if fault_in else "no fault-in")
        try:
            for burst in BURSTS:
                runs = [burst_rate(pipe, path, size, burst, seed, fault_in) for seed in range(3)]  # new offsets
                rows.append({"size": size, "readers": readers, "burst": burst, "fault_in": fault_in,
                             "fault_in_threads": preparers, "gbps_runs": [r / 1e9 for r in runs],
                             "gbps_median": statistics.median(runs) / 1e9})
                print(f"{size / 1e6:5.1f} MB x burst {burst:2d} on {readers} readers, {mode}: "
                      f"{rows[-1]['gbps_median']:.2f} GB/s ({', '.join(f'{r / 1e9:.2f}' for r in runs)})", flush=True)
        finally:
            pipe.close()
    with open(out, "w") as f:
        json.dump({"file": path, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(float(sys.argv[4])) if len(sys.argv) > 4 else 884736)
