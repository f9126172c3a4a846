"""Disk-tier experts, read when a router selects them.

A stacked expert tensor whose plan keeps some experts on disk lives in plain host memory that the
CPU computes from, like a RAM-tier one; never pinned, since pinned memory is resident whole. Its RAM
experts are written at load. Its disk experts are read from the file (O_DIRECT) only when a router
selects them, and dropped again (MADV_DONTNEED: their pages leave the process) once more than a
budget of them is resident. So decode reads from disk only the experts it uses, as the cost model
counts them (p x bytes), instead of whole stacked tensors.

Protocol
  - Load time, the loader's thread: `fill(info, tensor)` is the fill hook of these (deferred) tensors.
    It writes the RAM experts' slices and leaves the disk experts' pages untouched (never resident);
    the stack asks for small pages, so that an eviction gives back just its expert's pages; a stack of
    large experts asks for huge pages inside each expert's slice (never across two), which fault in
    faster (HUGE_SLICE_BYTES).
  - Compute time, on the thread running llama_decode: `page_in(layer, ids)` runs in the router hook,
    after the router ran and before the expert matmuls. It starts reading the missing experts, and
    meanwhile evicts least recently used experts that this batch does not use until the missing ones
    fit the budget; only then are their slices faulted in. It waits for the reads (the matmuls need
    them). A batch that needs more than the budget keeps them all until the next layer's call: a CPU plan's
    staging holds what one micro-batch may select (plan/microbatch.py), a GPU plan's one token's k.
  - The reads of one call go through a ReadPipeline (read_pipeline.py): as many reader threads as
    the machine profile found fastest (`Rates.disk_readers`) only read, into staging buffers; the
    compute thread copies each request into its slice as it lands. Each slice is faulted in first (one
    MADV_POPULATE_WRITE): by fault_in_threads() threads ahead of the copies where cores are spare, else
    by the compute thread, in both cases after the evictions. Only the compute thread touches the
    bookkeeping (evictions while the reads run, the new experts after all landed).
  - A failed read raises in the hook: the streamer stores it and `Llama` raises it after the decode. The call's
    slices leave the process first (none became resident), so failed calls never hold pages outside the budget.
  - Probe (`hypura bench`, between decodes, the same thread): `probe()` reads random disk experts through
    the same ReadPipeline into a scratch buffer (disk_probe.py); nothing resident changes.

Evictable RAM experts (`evict_ram`, decided in plan_policy.py): the paged stacks' RAM experts, written at load,
start in the same LRU as the read ones (oldest first), the budget grows by their bytes, and an evicted one is read
again when selected like a disk expert; so the stacks' whole capacity follows recency. Otherwise they stay fixed.

Budget: the plan's disk staging at least (plus the evictable RAM experts); every RESIZE_EVERY calls it grows to
what the RAM budget leaves beside the process's RSS (less RSS_MARGIN), since the plan's compute-buffer estimate is
generous and RAM left idle would only cost disk reads.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import random
import sys
import time
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hypura.bindings.ffi import ffi, lib
from hypura.plan import Plan
from hypura.plan.load_params import spare_cores
from hypura.plan.plan import TIERS
from hypura.plan.pools import paged_by_expert
from hypura.runtime.moe.disk_probe import burst_rate
from hypura.runtime.mechanism import Mechanism, TierStats
from hypura.runtime.placement import FileFiller, TensorInfo
from hypura.runtime.read_pipeline import ReadPipeline, Sink
from hypura.tiers.names import DISK, RAM

RESIZE_EVERY = 64  # page_in calls between RSS readings
RSS_MARGIN = 128 << 20  # kept free under the RAM budget: allocator slack, Python, reads in flight
# madvise advice (Linux); elsewhere nothing is advised, and evicted experts stay resident (their bytes valid)
_MADV_DONTNEED, _MADV_HUGEPAGE, _MADV_NOHUGEPAGE, _MADV_POPULATE_WRITE = 4, 14, 15, 23
_PAGE, _HUGE_PAGE = 4096, 2 << 20
# an expert slice this large holds >= 7 whole huge pages: faulted in as huge pages it runs ~4x faster (evict +
# fault-in of 40 MB slices, 2-core VM: 8.3 against 2.1 GB/s)
HUGE_SLICE_BYTES = 16 << 20
# one thread faults small pages in at ~1.8 GB/s (2-core VM), less than a disk gives several readers
FAULT_IN_MAX_THREADS = 4


def fault_in_threads() -> int:
    """Threads that fault slices in ahead of the copies: the spare cores, at most 4; none on small machines."""
    return min(FAULT_IN_MAX_THREADS, spare_cores(os.cpu_count() or 1))


def paged_tensors(plan: Plan) -> set[str]:
    """Stacked expert tensors with experts on disk: host memory, paged by expert."""
    return {t.name for t in plan.tensors if paged_by_expert(t)}


@dataclass
class PagingStats(TierStats):
    """accesses: (token, selected expert) pairs whose expert the pager manages (the plan's disk experts, and its
    RAM experts where they are evictable); hits[RAM]: of those, found resident; loads: experts read from disk;
    stall_s: the compute thread's time in calls that read."""

    resident_peak: int = 0
    waited_bytes: int = 0  # bytes read while compute waited
    served: Counter = field(default_factory=Counter)  # tier -> all MoE layers' selections it served
    by_layer: Counter = field(default_factory=Counter)  # layer -> experts read

    @property
    def reads(self) -> int:
        return self.loads

    def as_dict(self) -> dict:
        return {"accesses": self.accesses, "hits": self.hits[RAM], "reads": self.loads, "bytes": self.bytes[DISK],
                "evictions": self.evictions, "resident_peak": self.resident_peak, "served": dict(self.served),
                # what a layer's reads achieve while decode waits: beside `hypura bench`'s disk probe of the same reads
                "read_gbps_in_stall": self.waited_bytes / self.stall_s / 1e9 if self.stall_s else 0.0,
                # disk experts are read on demand only: no prefetches (the counters' shape is the expert cache's)
                "prefetch": {"issued": 0, "used": 0, "late": 0, "wasted": 0, "waits": 0, "precision": 0.0,
                             "recall": 0.0}}


@dataclass
class _Stack:
    info: TensorInfo
    tensor: object  # struct ggml_tensor *, in a host buffer
    expert_bytes: int


class ExpertPager(Mechanism):
    name = "expert_paging"

    def __init__(self, plan: Plan, tensors: set[str], paths: list[str], n_used: int, budget: int,
                 cached: bool = False, evict_ram: bool = False):
        """tensors: the plan's paged_tensors; budget: RAM bytes for resident disk experts (at least
        n_used experts of the largest layer); cached: the load reads through the page cache (load_reads.py);
        evict_ram: the paged stacks' RAM experts join the LRU (plan_policy.ram_experts_evictable)."""
        super().__init__()
        self.files = FileFiller(paths, cached)  # the loader's thread, at load
        self._reads = ReadPipeline(paths, plan.rates.disk_readers, preparers=fault_in_threads())  # compute time
        self.tensors = tensors
        # layer -> experts the plan keeps on disk (any of the layer's stacked tensors)
        self.on_disk: dict[int, set[int]] = defaultdict(set)
        expert_bytes: dict[int, int] = defaultdict(int)  # layer -> one expert's bytes over its stacks
        self.tier_of: dict[int, list[str]] = {}  # layer -> each expert's slowest tier over its stacks
        for t in plan.tensors:
            if t.experts:
                tiers = self.tier_of.setdefault(t.layer, list(t.experts))
                self.tier_of[t.layer] = [max(a, b, key=TIERS.index) for a, b in zip(tiers, t.experts)]
            if t.name in self.tensors:
                self.on_disk[t.layer] |= {e for e, tier in enumerate(t.experts) if tier == DISK}
                expert_bytes[t.layer] += t.nbytes // len(t.experts)
        staging = max(budget, n_used * max(expert_bytes.values(), default=0))
        self.resident: OrderedDict[tuple[int, int], int] = OrderedDict()  # (layer, expert) -> bytes, LRU first
        self.resident_bytes = 0
        # layer -> experts the pager reads and evicts: the disk ones, and the RAM ones where evictable
        self.managed: dict[int, set[int]] = {layer: set(disk) for layer, disk in self.on_disk.items()}
        self.evict_ram = evict_ram
        if evict_ram:
            self._ram_experts_into_lru(expert_bytes)
        self.ram_lru_bytes = self.resident_bytes  # RAM experts in the LRU from the load on
        self.budget = self.base_budget = staging + self.ram_lru_bytes
        self.ram_budget = plan.memory["ram"]["budget"]
        self._calls = 0
        self.stacks: dict[int, list[_Stack]] = defaultdict(list)
        self.stats = PagingStats()
        self._decode_bursts = [0, 0]  # decode layers that read, experts they read (never reset: the probe's size)
        self._probes = 0
        self._madvise = _libc_madvise()

    def _ram_experts_into_lru(self, expert_bytes: dict[int, int]) -> None:
        """The paged stacks' RAM experts, which fill() writes at load, start resident in the LRU (oldest first)."""
        for layer, disk in self.on_disk.items():
            for e in range(len(self.tier_of[layer])):
                if e not in disk:
                    self.managed[layer].add(e)
                    self.resident[(layer, e)] = expert_bytes[layer]
                    self.resident_bytes += expert_bytes[layer]

    # --- load time -----------------------------------------------------------------------------
    def fill(self, info: TensorInfo, tensor) -> None:
        n_expert = info.shape[2]
        stack = _Stack(info, tensor, info.nbytes // n_expert)
        self.stacks[info.layer].append(stack)
        # small pages: a huge page across two experts would be split by an eviction, zero all 2 MiB in a fault,
        # and khugepaged could fill an evicted expert's part back in (RSS). Large experts: huge pages inside each
        self._advise(stack, 0, n_expert, _MADV_NOHUGEPAGE)
        if stack.expert_bytes >= HUGE_SLICE_BYTES:
            for e in range(n_expert):
                self._advise(stack, e, 1, _MADV_HUGEPAGE, align=_HUGE_PAGE)
        disk = self.on_disk[info.layer]
        for first, last in _runs([e for e in range(n_expert) if e not in disk]):  # RAM experts, in runs
            self.files.read(*self._slice(stack, first, last - first + 1))

    # --- compute time (the protocol above) -------------------------------------------------------
    def page_in(self, layer: int, ids: np.ndarray) -> None:
        """ids [n_tokens, n_used]: the layer's selections; its experts are resident when this returns."""
        selected = [int(e) for e in ids.ravel()]
        managed = self.managed.get(layer)
        used = {e for e in selected if e in managed} if managed else set()
        if managed:
            reads = self.stats.loads
            self._demand(layer, selected, used)
            if len(ids) == 1 and self.stats.loads > reads:  # a decode layer that read: the probe's burst
                self._decode_bursts[0] += 1
                self._decode_bursts[1] += self.stats.loads - reads
        else:
            self._count_served(layer, selected)

    def _demand(self, layer: int, selected: list[int], used: set[int]) -> None:
        self._calls += 1
        if self._calls % RESIZE_EVERY == 1:
            self._resize()
        self.stats.accesses += sum(e in self.managed[layer] for e in selected)
        t0, read_before = time.perf_counter(), self.stats.bytes[DISK]
        missing = []
        for e in sorted(used):
            key, count = (layer, e), sum(x == e for x in selected)
            if key not in self.resident:
                missing.append(e)
                continue
            self.resident.move_to_end(key)
            self.stats.hits[RAM] += count
        self._count_served(layer, selected, self.managed[layer], missing)
        expert_bytes = self._expert_bytes(layer)
        slices = [(stack, e) for e in missing for stack in self.stacks[layer]]
        # the reads (into staging) start first and evictions run meanwhile, as they delayed the reads (MADV_DONTNEED
        # of ~8 MB a layer: 1.9 ms on the CPU VM); no slice faults in before they made room (RSS stays in).
        # A failed read raises here, on the compute thread
        keep, room = {(layer, e) for e in used}, len(missing) * expert_bytes
        try:
            self._reads.run([self._slice(stack, e, 1) for stack, e in slices],
                            before_first=lambda i: self._advise(*slices[i], 1, _MADV_POPULATE_WRITE),
                            meanwhile=lambda: self._evict(keep, room))
        except BaseException:  # slices faulted in before a read failed hold no expert: their pages leave too
            for stack, e in slices:
                self._advise(stack, e, 1, _MADV_DONTNEED)
            raise
        for e in missing:
            self._count_read(layer, e, expert_bytes)
        self.stats.resident_peak = max(self.stats.resident_peak, self.resident_bytes)
        read = self.stats.bytes[DISK] - read_before
        if read:  # compute waited for these reads
            waited = time.perf_counter() - t0
            self.stats.stall_s += waited
            self.stats.waited_bytes += read
            self.traffic.bytes[DISK] += read
            self.traffic.stall_s += waited
            self.traffic.waits += 1

    def _count_read(self, layer: int, e: int, expert_bytes: int) -> None:
        self.resident[(layer, e)] = expert_bytes
        self.resident_bytes += expert_bytes
        self.stats.loads += 1
        self.stats.demand_loads += 1
        self.stats.bytes[DISK] += expert_bytes
        self.stats.by_layer[layer] += 1

    def _expert_bytes(self, layer: int) -> int:
        return sum(stack.expert_bytes for stack in self.stacks[layer])

    def _count_served(self, layer: int, selected: list[int], disk=frozenset(), missing=()) -> None:
        """Each selection by the tier it was served from: a disk expert found resident, from RAM."""
        tiers = self.tier_of.get(layer)
        for e in selected if tiers else ():
            self.stats.served[DISK if e in missing else RAM if e in disk else tiers[e]] += 1

    def _resize(self) -> None:
        """Grow (or shrink back towards the plan's share) to what the RAM budget leaves beside RSS."""
        import psutil

        slack = self.ram_budget - psutil.Process().memory_info().rss - RSS_MARGIN
        self.budget = max(self.base_budget, self.resident_bytes + slack)

    def _evict(self, keep: set, room: int) -> None:
        """Drop least recently used experts outside `keep` until `room` more bytes fit."""
        for key in list(self.resident):
            if self.resident_bytes + room <= self.budget:
                return
            if key in keep:
                continue
            self._drop(key)
            self.stats.evictions += 1

    def _drop(self, key: tuple[int, int]) -> None:
        self.resident_bytes -= self.resident.pop(key)
        layer, e = key
        for stack in self.stacks[layer]:
            self._advise(stack, e, 1, _MADV_DONTNEED)  # its pages leave the process

    def _slice(self, stack: _Stack, first: int, count: int) -> tuple[TensorInfo, Sink]:
        """Experts [first, first + count) of a stack: their range of the file, and a sink writing them."""
        at, tensor = first * stack.expert_bytes, stack.tensor
        part = dataclasses.replace(stack.info, file_offset=stack.info.file_offset + at, nbytes=count * stack.expert_bytes)
        return part, lambda piece, pos: lib().ggml_backend_tensor_set(tensor, ffi.from_buffer(piece), at + pos, len(piece))

    def close(self) -> None:
        self._reads.close()  # its readers finish first: none may still write into the tensors
        self.files.close()

    def _advise(self, stack: _Stack, first: int, count: int, advice: int, align: int = _PAGE) -> None:
        """madvise the `align`-aligned blocks that lie wholly inside experts [first, first + count) of the stack."""
        if self._madvise is None:
            return
        base = int(ffi.cast("uintptr_t", lib().ggml_get_data(stack.tensor))) + first * stack.expert_bytes
        lo, hi = inner_blocks(base, count * stack.expert_bytes, align)
        if hi > lo:
            self._madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), advice)  # EINVAL (old kernel): a no-op

    def probe(self, seconds: float) -> Optional[dict]:
        """The disk's rate now for decode's reads (disk_probe.py): bursts of a random layer's random disk
        experts, as many as a decode layer that read has read on average so far (1 before any); None without
        disk experts. Each probe reads other experts than the last: a storage layer's cache must not serve it."""
        layers = sorted(layer for layer, experts in self.on_disk.items() if experts and self.stacks.get(layer))
        if not layers:
            return None
        calls, experts = self._decode_bursts
        per_burst = max(1, round(experts / calls)) if calls else 1
        self._probes += 1
        rng = random.Random(self._probes)

        def next_burst() -> list[TensorInfo]:
            layer = rng.choice(layers)
            chosen = rng.sample(sorted(self.on_disk[layer]), min(per_burst, len(self.on_disk[layer])))
            return [self._slice(stack, e, 1)[0] for e in chosen for stack in self.stacks[layer]]

        return {**burst_rate(self._reads, next_burst, seconds), "experts_per_burst": per_burst}

    def reset_stats(self) -> None:
        self.stats = PagingStats(resident_peak=self.resident_bytes)

    def summary(self) -> dict:
        return {**self.stats.as_dict(), "budget": self.budget, "resident": self.resident_bytes,
                "ram_in_lru_bytes": self.ram_lru_bytes,  # the budget's share for RAM experts that joined the LRU
                "hit_rate": self.stats.hit_rate(RAM)}


def inner_blocks(start: int, nbytes: int, align: int) -> tuple[int, int]:
    """The `align`-aligned [lo, hi) inside [start, start + nbytes); empty (hi <= lo) when no block fits."""
    return -(-start // align) * align, (start + nbytes) // align * align


def _runs(values: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted ints as (first, last)."""
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    fn = ctypes.CDLL(None, use_errno=True).madvise
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return fn
