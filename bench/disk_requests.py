"""How fast does the disk serve expert-sized reads? O_DIRECT reads (hypura's DirectReader, 4 MiB staging)
of random SIZE-byte slices of FILE, on 1..N threads at once; the page cache dropped by the caller.

    python3 bench/disk_requests.py FILE OUT.json [SIZE ...]      (default: 0.9 MB and 40 MB)

Why: the expert pager reads a selected expert as one request per stacked tensor (qwen3-30b-a3b: three
~1 MB requests; mixtral-8x7b Q5_K_M: three 40 MB ones) on the profile's best thread count, which the
profile finds with 4 MiB requests. Prediction: 40 MB reads reach the profiled ~1.4-1.6 GB/s on one
thread; 1 MB ones lose a request's latency each, and need 2-4 threads to get there.
"""

import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from hypura.runtime.direct_io import DirectReader

TOTAL, THREADS = 512 << 20, (1, 2, 4, 8)


def rate(path: str, size: int, threads: int, seed: int) -> float:
    n = max(threads, TOTAL // size)
    span = os.path.getsize(path) - size
    rng = random.Random(seed)
    offsets = [rng.randrange(0, span) // 32 * 32 for _ in range(n)]  # GGUF aligns tensors to 32 bytes

    def work(part):
        with DirectReader(path) as reader:
            for off in part:
                reader.read(off, size, lambda piece, at: None)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, [offsets[i::threads] for i in range(threads)]))
    return n * size / (time.perf_counter() - t0)


def main(path: str, out: str, sizes: list[int]) -> None:
    rows = []
    for size in sizes:
        for threads in THREADS:
            runs = [rate(path, size, threads, seed) for seed in range(3)]  # new offsets each run: no cache hits
            rows.append({"size": size, "threads": threads, "gbps_runs": [r / 1e9 for r in runs],
                         "gbps_median": statistics.median(runs) / 1e9})
            print(f"{size / 1e6:7.1f} MB x {threads} threads: {rows[-1]['gbps_median']:.2f} GB/s "
                  f"({', '.join(f'{r / 1e9:.2f}' for r in runs)})", flush=True)
    with open(out, "w") as f:
        json.dump({"file": path, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(float(s)) for s in sys.argv[3:]] or [884736, 40370176])
