"""Does evicting while the reads run (the pager since f1ad3a3) read a layer's experts faster than evicting
before them (d81d257)? Bursts of expert-sized O_DIRECT reads of FILE through the pager's ReadPipeline, the
modes interleaved burst by burst, so that the disk's drift (0.9-1.9 GB/s within one H200 lease) falls on
all of them alike:
  probe      read into one scratch buffer, no fault-in, no eviction (disk_probe.py's way);
  before     evict (MADV_DONTNEED of an earlier burst's slots), then read, slots faulted in on the fault-in threads;
  meanwhile  read first, evict while the reads run, slots faulted in once the eviction is done (f1ad3a3).

    python3 bench/evict_order.py FILE OUT.json READERS [BURST] [ROUNDS]     (BURST: slices a layer reads, 9)

Why: on the H200 (session 18) the pager with evictions meanwhile read 0.90-1.00 of the probed rate, against
0.68-1.00 before, yet decode ran slower in 7 of 8 alternating pairs, and so did those runs' probes: runs minutes
apart cannot separate the change from the disk. Prediction: meanwhile reads faster than before by the eviction's
time (~0.5 ms of a ~7 ms burst: +5-8%); both below the probe by the fault-in and copy.
"""

import ctypes
import json
import mmap
import os
import random
import statistics
import sys
import time
from typing import Optional

from hypura.runtime.expert_paging import (_MADV_DONTNEED, _MADV_NOHUGEPAGE, _MADV_POPULATE_WRITE, _libc_madvise,
                                          fault_in_threads)
from hypura.runtime.disk_probe import scratch_sink
from hypura.runtime.placement import TensorInfo, Tier
from hypura.runtime.read_pipeline import ReadPipeline, Sink

SLICE = (900 << 10) // 4096 * 4096  # a qwen3-30b-a3b expert's Q4_K tensor (~0.9 MB), in whole pages
RING = 8  # bursts of slots: a burst evicts the slots the burst RING - 1 before it filled
MODES = ("probe", "before", "meanwhile")
PAGE = 4096


class Slots:
    """RING x burst expert slices of anonymous memory, small pages (as the pager's stacks of small experts)."""

    def __init__(self, burst: int):
        self.burst, self.size = burst, SLICE
        self.mem = mmap.mmap(-1, RING * burst * self.size)
        self._anchor = ctypes.c_char.from_buffer(self.mem)
        self.base = ctypes.addressof(self._anchor)
        self.madvise = _libc_madvise()
        self.madvise(ctypes.c_void_p(self.base), ctypes.c_size_t(len(self.mem)), _MADV_NOHUGEPAGE)

    def advise(self, slot: int, advice: int) -> None:
        self.madvise(ctypes.c_void_p(self.base + slot * self.size), ctypes.c_size_t(self.size), advice)

    def sink(self, slot: int):
        def write(piece, pos):
            at = slot * self.size + pos
            self.mem[at:at + len(piece)] = piece
        return write

    def close(self) -> None:
        del self._anchor
        self.mem.close()


def one_burst(mode: str, pipe: ReadPipeline, slots: Optional[Slots], scratch: Sink, offsets: list[int],
              b: int) -> None:
    """b: this mode's burst count; each evicting mode has slots of its own, so every eviction frees filled pages."""
    infos = [TensorInfo(name=f"slice {i}", ggml_type=0, shape=(SLICE,), file_offset=o, nbytes=SLICE,
                        file_idx=0, layer=0, default_tier=Tier.HOST, default_buft="CPU") for i, o in enumerate(offsets)]
    if mode == "probe":
        pipe.run([(info, scratch) for info in infos])
        return
    ring = b % RING * slots.burst
    land = [ring + i for i in range(slots.burst)]
    victims = [(ring + slots.burst) % (RING * slots.burst) + i for i in range(slots.burst)]  # filled RING - 1 ago

    def evict() -> None:
        for s in victims:
            slots.advise(s, _MADV_DONTNEED)

    parts = [(info, slots.sink(s)) for info, s in zip(infos, land)]
    if mode == "before":
        evict()
        pipe.run(parts, before_first=lambda i: slots.advise(land[i], _MADV_POPULATE_WRITE))
        return
    # the pager's way (ExpertPager._demand): ReadPipeline.run faults nothing in until the evictions returned
    pipe.run(parts, before_first=lambda i: slots.advise(land[i], _MADV_POPULATE_WRITE), meanwhile=evict)


def main(path: str, out: str, readers: int, burst: int, rounds: int) -> None:
    pipe = ReadPipeline([path], readers, preparers=fault_in_threads())
    slots, scratch = {mode: Slots(burst) for mode in MODES[1:]}, scratch_sink(pipe.request)
    span = os.path.getsize(path) - SLICE
    for own in slots.values():  # every slot holds pages before the first eviction, as a running pager's do
        for i in range(RING * burst):
            own.advise(i, _MADV_POPULATE_WRITE)
    bursts_per_round = max(1, (512 << 20) // (burst * SLICE))  # ~0.5 GB a mode a round
    rows = []
    try:
        for r in range(rounds):
            rng = random.Random(r)
            spent = dict.fromkeys(MODES, 0.0)
            for b in range(bursts_per_round):
                for k, mode in enumerate(MODES[b % 3:] + MODES[:b % 3]):  # each mode goes first in turn
                    offsets = [rng.randrange(0, span) // 32 * 32 for _ in range(burst)]  # GGUF aligns to 32
                    t0 = time.perf_counter()
                    one_burst(mode, pipe, slots.get(mode), scratch, offsets, b)
                    spent[mode] += time.perf_counter() - t0
            nbytes = bursts_per_round * burst * SLICE
            row = {"round": r, "burst": burst, "readers": readers, "slice_bytes": SLICE,
                   **{f"{m}_gbps": nbytes / spent[m] / 1e9 for m in MODES}}
            rows.append(row)
            print(f"round {r}: " + ", ".join(f"{m} {row[m + '_gbps']:.2f}" for m in MODES) + " GB/s, "
                  f"meanwhile/before {row['meanwhile_gbps'] / row['before_gbps']:.3f}", flush=True)
    finally:
        pipe.close()
        for own in slots.values():
            own.close()
    ratios = [row["meanwhile_gbps"] / row["before_gbps"] for row in rows]
    summary = {"rounds": rows, "meanwhile_over_before_median": statistics.median(ratios),
               "before_over_probe_median": statistics.median(row["before_gbps"] / row["probe_gbps"] for row in rows),
               "meanwhile_over_probe_median": statistics.median(row["meanwhile_gbps"] / row["probe_gbps"]
                                                                for row in rows)}
    print(f"median meanwhile/before {summary['meanwhile_over_before_median']:.3f}, "
          f"before/probe {summary['before_over_probe_median']:.3f}, "
          f"meanwhile/probe {summary['meanwhile_over_probe_median']:.3f}")
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 9,
         int(sys.argv[5]) if len(sys.argv) > 5 else 5)
