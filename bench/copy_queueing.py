"""Does a small host->GPU copy (an activation at a CPU->GPU hand-off) wait behind a large weight copy
running on another stream? Latency of a 64 KiB copy, idle and while a 1 GiB pinned copy is in flight,
for several ways of issuing either.

    python3 bench/copy_queueing.py OUT.json      (GPU machine; uses the PyTorch of its image)

Prediction if the copy engine is one FIFO: the busy latency is about the big copy's remaining time
(~15 ms of its ~19 ms), whatever the streams; if engines run streams concurrently: ~0.05 ms.
"""

import json
import statistics
import sys
import time

import torch

BIG, SMALL, HEAD_START_S, REPS = 1 << 30, 64 << 10, 0.003, 7


def timed(fn, stream) -> float:
    t0 = time.perf_counter()
    fn()
    stream.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main(out: str) -> None:
    dev = torch.device("cuda")
    big_src = torch.empty(BIG, dtype=torch.uint8, pin_memory=True)
    big_dst = torch.empty(BIG, dtype=torch.uint8, device=dev)
    small_pinned = torch.ones(SMALL, dtype=torch.uint8, pin_memory=True)
    small_pageable = torch.ones(SMALL, dtype=torch.uint8)
    small_dst = torch.empty(SMALL, dtype=torch.uint8, device=dev)
    big_stream, small_stream = torch.cuda.Stream(), torch.cuda.Stream()
    high = torch.cuda.Stream(priority=-1)

    def big_whole():
        with torch.cuda.stream(big_stream):
            big_dst.copy_(big_src, non_blocking=True)

    def big_chunks(n):
        def issue():
            with torch.cuda.stream(big_stream):
                step = BIG // n
                for i in range(n):
                    big_dst[i * step:(i + 1) * step].copy_(big_src[i * step:(i + 1) * step], non_blocking=True)
        return issue

    def small_h2d(src, stream):
        def issue():
            with torch.cuda.stream(stream):
                small_dst.copy_(src, non_blocking=True)
        return issue

    def small_d2h():
        with torch.cuda.stream(small_stream):
            small_pinned.copy_(small_dst, non_blocking=True)

    cases = {
        "h2d pinned, other stream": (small_h2d(small_pinned, small_stream), small_stream),
        "h2d pinned, high-priority stream": (small_h2d(small_pinned, high), high),
        "h2d pageable, other stream": (small_h2d(small_pageable, small_stream), small_stream),
        "d2h pinned, other stream": (small_d2h, small_stream),
    }
    results = {"gpu": torch.cuda.get_device_name(0)}
    big_whole()
    big_stream.synchronize()
    results["big_copy_ms"] = statistics.median(timed(big_whole, big_stream) for _ in range(REPS))
    for name, (fn, stream) in cases.items():
        fn()
        stream.synchronize()
        idle = [timed(fn, stream) for _ in range(REPS)]
        row = {"idle_ms": statistics.median(idle)}
        for label, big in (("busy_ms", big_whole), ("busy_16MiB_chunks_ms", big_chunks(64)),
                           ("busy_4MiB_chunks_ms", big_chunks(256))):
            lat = []
            for _ in range(REPS):
                big()
                time.sleep(HEAD_START_S)
                lat.append(timed(fn, stream))
                big_stream.synchronize()
            row[label] = statistics.median(lat)
        results[name] = row
        print(name, {k: round(v, 3) for k, v in row.items()})
    print("big copy", round(results["big_copy_ms"], 2), "ms")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
