"""How fast can the pager make room for an expert it reads? No disk: in an anonymous mapping with small
pages (as the pager's stacks), give an expert-sized slice back (MADV_DONTNEED, as an eviction), fault it
in again (MADV_POPULATE_WRITE, as page_in) and copy an expert's bytes into it; 1..4 threads at once.

    python3 bench/fault_in.py OUT.json [SIZE ...]      (default: 0.9 MB and 40 MB, the experts' slices)

Why: on this repo's 2-core VM, with the model file on a RAM-backed loop device that serves 0.9 MB
O_DIRECT reads at 4.5-7.3 GB/s, the pager read at ~1.2 GB/s, and faulting in took 74-82% of its
time (2026-12-03). On the H200 the pager read 0.8-1.3 GB/s from disks profiled at 1.0-1.9 GB/s.
Prediction: fault-in runs near 1.5 GB/s a thread there too, and is what caps the pager. Large experts
(slices >= expert_paging.HUGE_SLICE_BYTES) now fault in as huge pages; this measures the small pages that
the Qwen shape's 0.9 MB experts keep.
"""

import ctypes
import json
import mmap
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hypura.runtime.expert_paging import _MADV_DONTNEED, _MADV_NOHUGEPAGE, _MADV_POPULATE_WRITE, _libc_madvise

TOTAL, THREADS, PAGE = 1 << 30, (1, 2, 4), 4096


def rates(size: int, threads: int) -> dict:
    """GB/s of each step over TOTAL bytes of slices, spread over `threads` threads (each its own slices)."""
    madvise = _libc_madvise()
    size = size // PAGE * PAGE
    n = TOTAL // size
    region = mmap.mmap(-1, n * size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    view = np.frombuffer(region, dtype=np.uint8)
    expert = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    madvise(ctypes.c_void_p(base), ctypes.c_size_t(n * size), _MADV_NOHUGEPAGE)
    view[:] = 1  # resident once, as a stack after a first pass
    seconds = {"evict": 0.0, "fault_in": 0.0, "copy": 0.0}

    def work(slices):
        took = dict.fromkeys(seconds, 0.0)
        for i in slices:
            at = ctypes.c_void_p(base + i * size)
            t0 = time.perf_counter()
            madvise(at, ctypes.c_size_t(size), _MADV_DONTNEED)
            t1 = time.perf_counter()
            madvise(at, ctypes.c_size_t(size), _MADV_POPULATE_WRITE)
            t2 = time.perf_counter()
            view[i * size:(i + 1) * size] = expert
            took["evict"] += t1 - t0
            took["fault_in"] += t2 - t1
            took["copy"] += time.perf_counter() - t2
        return took

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for took in pool.map(work, [range(t, n, threads) for t in range(threads)]):
            for k, v in took.items():
                seconds[k] += v
    wall = time.perf_counter() - t0
    del view
    region.close()
    # per step: bytes over its seconds summed over threads (one thread's rate); all: bytes over the wall
    return {**{k: n * size / v / 1e9 * threads for k, v in seconds.items()}, "all": n * size / wall / 1e9}


def main(out: str, sizes: list[int]) -> None:
    rows = []
    for size in sizes:
        for threads in THREADS:
            runs = [rates(size, threads) for _ in range(3)]
            row = {"size": size, "threads": threads, "runs": runs,
                   **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}
            rows.append(row)
            print(f"{size / 1e6:7.1f} MB x {threads} threads: all {row['all']:.2f} GB/s; fault-in "
                  f"{row['fault_in']:.2f}, copy {row['copy']:.2f}, evict {row['evict']:.1f} GB/s (all threads)", flush=True)
    with open(out, "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], [int(float(s)) for s in sys.argv[2:]] or [884736, 40370176])
