"""The placement search: an exact method for the structure of the cost model, and a greedy baseline.

Objective: the predicted time of a chat turn (knobs.OBJECTIVE_*: prompt at the prefill rate, then
decode), so decode speed dominates but is not bought with a far slower prefill.

Structure. A unit's contribution to every path is (access probability p) x (bytes), and moving a
byte of higher p into a faster tier (GPU > RAM > disk) never increases any path of cost.predict
(an exchange argument: GPU reads faster than the CPU, RAM faster than disk). So for fixed memory
reservations the optimum fills the tiers in order of p (ties: knobs.ROLE_RANK, then graph order),
skipping a unit that does not fit for the next that does: exact for the fractional relaxation,
within one unit per tier for the integer problem. A layer's experts enter the GPU together, at their
mean p: they are one stacked tensor, which llama.cpp keeps in one buffer. What the fill cannot see is
enumerated: where the KV cache lives (GPU or RAM), whether GPU pool slots are reserved for streaming
(slots cost GPU memory that resident weights could use), and whether to use the GPU at all (a budget
too small for its buffers; tiny models). For each such config, the non-resident units are split
between CPU compute and streaming into GPU slots along one path (disk units, then RAM units, attention first, layers spread),
keeping its best prefix: the compute term falls and the link term rises linearly, but the path is not
convex where a batch's CPU matmuls slow beside streaming or op offload turns back on (the closed form is
non-resident bytes / (CPU rate + link rate) when nothing else binds). Memory for slots and disk staging depends on the
fill and split; it is reserved by iterating to a fixed point (reservations only grow, so this ends).

Per-step paths. Where a RAM unit is computed follows the step: with the tiers fixed, the split above runs again
over the RAM units alone for steps of 1, 2, 4, ... n_ubatch tokens, the plan's own step and the largest before op
offload (`step_sizes`, `step_paths`), and over the expert stacks of layers whose experts are all in RAM, a layer's
as one move (its stacked tensors stream whole: the link carries all of them, cost.streamed_bytes); the plan keeps
that table, the slots hold any layer a step streams (where they cannot, no stacks stream), and a plan
made for several sequences is scored for one too, which reads its own share of the KV cache (`kv_read`).

The walks' sums are taken over every unit at once (plan/unit_sums.py), to the bit those of a walk that adds unit by
unit, so ties break as they would; what depends on the model alone is made once for all its problems (plan/model_orders.py).

The candidates each config gives, the one kept and the RAM floor are plan/search.py's.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hypura.errors import HypuraError
from hypura.plan import knobs
from hypura.plan.budget import Budgets, fmt_size
from hypura.plan.cost import (CPU, DISK, GPU, RAM, Prediction, Rates, StepLoad, Traffic, attention_flops, predict,
                              traffic)
from hypura.plan.microbatch import experts_per_call
from hypura.plan.model_orders import ModelOrders
from hypura.plan.staging import staging_reserves, staging_slots
from hypura.plan.steps import kv_read, path_at, predict_step, step_sizes, turn_seconds
from hypura.plan.unit_sums import CODE, Moves, Placed, as_codes, codes, first_fastest, walk_seconds
from hypura.units import ModelUnits


@dataclass(frozen=True)
class PlanSettings:
    n_ctx: int = 4096  # llama.cpp's default context (common_params.n_ctx); every sequence's cells together
    n_ubatch: int = knobs.N_UBATCH
    prefetch_depth: int = knobs.PREFETCH_DEPTH
    kv_bytes_per_element: float = knobs.KV_BYTES_PER_ELEMENT
    # sequences decoded together (`--parallel`, llama.cpp's n_seq_max): a decode step carries one token
    # of each, and the plan minimises the time of such steps (cost.py)
    parallel: int = 1
    # llama.cpp's n_outputs_max: the most logits rows a micro-batch computes, which its compute buffer holds
    # (0: every token, llama.cpp's default); plan/microbatch.py outputs_needed
    n_outputs: int = 0

    def __post_init__(self):
        if self.n_ctx < 1 or self.n_ubatch < 1 or self.prefetch_depth < 0 or self.parallel < 1 or self.n_outputs < 0:
            raise HypuraError("context, micro-batch and parallel sequences must be >= 1, prefetch depth and outputs >= 0")


@dataclass(frozen=True)
class Solution:
    tiers: tuple[str, ...]  # per unit of ModelUnits.units
    compute: tuple[str, ...]  # gpu | cpu, per unit
    kv_tier: str
    slot_bytes: int  # one GPU pool slot (a layer's streamed units); 0: no pool
    staging_bytes: int  # one pinned RAM staging slot for disk reads; 0: none
    memory: dict  # tier -> {part: bytes}
    traffic: Traffic
    prediction: Prediction
    solver: str
    config: str
    steps: tuple = ()  # ((tokens, RAM units streamed at steps of up to that many tokens), ...)
    one: Prediction | None = None  # one sequence's prediction, when the plan is made for several
    why: str = ""  # why this candidate over the others (_pick), where the choice was close or ran against the fastest
    stage_slots: int = 0  # RAM staging slots for disk layers (fewer than prefetch depth + 1 at the RAM floor); 0: those
    # the prediction at a step of k tokens on its own path (a plan runs fewer sequences as a server's clients come
    # and go: candidates.choose asks the two it compares)
    at: Callable[[int], Prediction] | None = field(default=None, compare=False, repr=False)

    @property
    def streams(self) -> bool:
        """Hypura's own mechanism: weights streamed into GPU slots. Otherwise the placement is llama.cpp's kind
        (resident tiers, CPU weights as llama.cpp holds them or pinned as its -lm none does, its kernels)."""
        return bool(self.slot_bytes)

    @property
    def turn_s(self) -> float:
        """A plan made for several sequences serves one too: both turns count."""
        return turn_seconds(self.prediction) + (turn_seconds(self.one) if self.one is not None else 0.0)


@dataclass(frozen=True)
class _Walk:
    """The split's walk over a placement (_Problem._walk): its tiers, each unit's compute at its start, the moves
    in order (a unit, or a layer's RAM expert stacks), the units each of a step's sums takes at its start
    (UnitSums.load), and what each move is (_Problem._moves)."""

    tiers: list[str]
    compute: tuple[str, ...]
    moves: list[list[int]]
    placed: Placed
    units: np.ndarray  # each move's unit; -1: a layer's stacks
    stages: np.ndarray  # the stacks' layer; -1: a unit
    disk: np.ndarray  # a unit from the disk tier


@dataclass(frozen=True)
class _Shortfall:
    tier: str
    need: int
    have: int
    detail: str


class _Problem:
    def __init__(self, mu: ModelUnits, budgets: Budgets, rates: Rates, settings: PlanSettings):
        self.mu, self.b, self.r, self.s = mu, budgets, rates, settings
        d = mu.dims
        self.kv = d.kv_bytes_per_layer(settings.n_ctx, settings.kv_bytes_per_element) * d.n_layer
        self.buf = d.compute_buffer_bytes(settings.n_ubatch, n_outputs=settings.n_outputs)
        # the CPU's compute buffer, when no GPU computes: the estimate without the floor (a GPU
        # backend's), at llama.cpp's micro-batch, which is at most the context (llama-context.cpp:
        # n_batch = min(n_ctx, n_batch)). llama.cpp logged 49.1 and 98.3 MiB (SmolLM2-135M, n_ctx 256 and
        # 4096) and 133.3 MiB (llama3.1-8b shape, n_ctx 256) where this gives 55.5, 111.0 and 185.2 MiB
        self.cpu_buf = d.compute_buffer_bytes(min(settings.n_ubatch, settings.n_ctx), floor=0, n_outputs=settings.n_outputs)
        self.n_slots = settings.prefetch_depth + 1
        # a layer's disk experts a slot holds: one micro-batch's selections, which the pager keeps until it computed
        self.per_call = experts_per_call(d.n_expert_used, settings.n_ubatch, rates.has_gpu)
        self.gpu_usable = rates.has_gpu and budgets.gpu > 0
        self.host_only = sum(u.nbytes for u in mu.units if u.host_only)
        model = ModelOrders.of(mu)
        self.expert_groups, self.density_order = model.expert_groups, model.density_order
        self.host_order, self.sums, self._stacks_moves = model.host_order, model.sums, model.stacks_moves
        self.gpu_moves, self.ram_moves, self.layers_down = model.gpu_moves, model.ram_moves, model.layers_down
        self._solved: dict[tuple, Solution | _Shortfall] = {}  # solve's, by config

    def with_ram(self, ram: int) -> _Problem:
        """This problem at another RAM budget (the RAM floor's bisection), sharing what depends only on the model,
        rates and settings: the orders, the per-unit arrays and the stacks' sums."""
        p = copy.copy(self)
        p.b, p._solved = dataclasses.replace(self.b, ram=ram), {}
        return p

    def slots_need(self, tiers, compute, select: Callable[[str, str], bool], n_slots: int = 0) -> list[int]:
        """Bytes of each pool slot as the runtime lays them out (runtime/stream_layout.py): the
        selected layers take the n slots (default prefetch depth + 1) round-robin in graph order, a slot as
        large as its largest."""
        n = n_slots or self.n_slots
        need = self.stage_need(tiers, compute, select)
        stages = sorted(need)
        return [max((need[s] for s in stages[i::n]), default=0) for i in range(n)]

    def stage_need(self, tiers, compute, select: Callable[[str, str], bool]) -> dict[int, int]:
        """Bytes each layer must have in a slot: its selected dense units and RAM experts (stacks streamed
        whole) plus the largest selected disk experts one call may select (per_call: microbatch.experts_per_call)."""
        t, c = as_codes(tiers), as_codes(compute)
        chosen = np.zeros((len(CODE), len(CODE)), dtype=bool)  # select, of each (tier, device) pair
        for tier, i in CODE.items():
            for dev, j in CODE.items():
                chosen[i, j] = select(tier, dev)
        return self.sums.stage_need(chosen[t, c], t, self.per_call)

    def fill_by_density(self, gpu_cap: int, ram_cap: int) -> list[str]:
        """The GPU first, by density (a layer's experts as one group, by their mean p); then RAM, unit
        by unit by its own density, so a layer's often-chosen experts stay in RAM and its rare ones go
        to disk; the rest to disk."""
        tiers: list[str | None] = [None] * len(self.mu.units)  # host_only: reserved in RAM up front
        for first, end, size in self.gpu_moves:
            fits = size <= gpu_cap and (not self.b.unified or size <= ram_cap)
            tiers[first:end] = [GPU if fits else RAM] * (end - first)
            if fits:
                gpu_cap -= size
                ram_cap -= size if self.b.unified else 0
        for i, nbytes in self.ram_moves:
            if tiers[i] == RAM:
                if nbytes <= ram_cap:
                    ram_cap -= nbytes
                else:
                    tiers[i] = DISK
        return [RAM if t is None else t for t in tiers]

    def fill_like_ngl(self, gpu_cap: int, ram_cap: int) -> list[str]:
        units = self.mu.units
        tiers: list[str | None] = [None] * len(units)
        for group, size in self.layers_down:
            if size > gpu_cap or (self.b.unified and size > ram_cap):
                break
            for i in group:
                tiers[i] = GPU
            gpu_cap -= size
            ram_cap -= size if self.b.unified else 0
        for i, u in enumerate(units):
            if tiers[i] is None:
                if u.host_only or u.nbytes <= ram_cap:
                    tiers[i], ram_cap = RAM, ram_cap - (0 if u.host_only else u.nbytes)
                else:
                    tiers[i] = DISK
        return tiers

    def split(self, tiers: list[str], kv_tier: str, op_offload: bool, parallel: int | None = None,
              base: list[str] | None = None, pinned: bool = False, stacks: bool = True) -> list[str]:
        """Move non-resident units to GPU compute (streamed into slots) while the time of a step of `parallel`
        tokens (the plan's) falls. base: the plan's split, whose disk units keep their path; then only RAM
        units move (a step's own path: step_paths), with the expert stacks of all-RAM layers where `stacks`."""
        walk = self._walk(tiers, base, stacks)
        compute = list(walk.compute)
        for group in walk.moves[:self._best_prefixes(walk, kv_tier, op_offload, [parallel or self.s.parallel],
                                                     pinned)[0]]:
            for i in group:
                compute[i] = GPU
        return compute

    def _walk(self, tiers: list[str], base: list[str] | None, stacks: bool) -> _Walk:
        """The split's start (`compute`) and the moves it walks, the same for every step size."""
        units, at_tier = self.mu.units, codes(tiers)
        start = np.where(at_tier == CODE[GPU], CODE[GPU], CODE[CPU]).astype(np.int8)
        if base:  # its disk units keep their path
            start = np.where(at_tier == CODE[DISK], codes(base), start).astype(np.int8)
        compute = tuple(_NAMES[start].tolist())
        dense = ~self.sums.host_only & ~self.sums.expert & ~self.sums.resident  # a resident unit never streams
        # the plan's own path streams no experts: a step's path may (below); paged ones an expert cache loads one
        # by one instead (plan/experts.py)
        movable = [] if base else [[i] for i in np.flatnonzero((at_tier == CODE[DISK]) & dense).tolist()]
        ram = np.flatnonzero((at_tier == CODE[RAM]) & dense).tolist()
        # layers spread out (any prefix interleaves with the rest), so the copy engine streams the
        # next GPU layer while the CPU computes the layers between; a layer's units stay together
        spread = _spread_order(sorted({units[i].stage for i in ram}))
        # attention first: its CPU compute beside a GPU KV cache costs two more hand-offs a layer
        movable += [[i] for i in sorted(ram, key=lambda i: (units[i].role != "attn", spread[units[i].stage], i))]
        # a step's path: then the layers whose experts are all in RAM, each as one move (its stacks stream whole)
        if base and stacks:
            groups = self.ram_stacks(tiers)
            spread = _spread_order(sorted(groups))
            movable += [groups[s] for s in sorted(groups, key=spread.get)]
        one = [len(group) == 1 for group in movable]
        return _Walk(tiers, compute, movable, self.sums.placed(at_tier, start, self.r.unified),
                     np.array([g[0] if o else -1 for g, o in zip(movable, one)], dtype=np.int64),
                     np.array([-1 if o else units[g[0]].stage for g, o in zip(movable, one)], dtype=np.int64),
                     np.array([o and tiers[g[0]] == DISK for g, o in zip(movable, one)], dtype=bool))

    def _best_prefixes(self, walk: _Walk, kv_tier: str, op_offload: bool, sizes: list[int], pinned: bool) -> list[int]:
        """How many of the walk's moves a step of each of `sizes` tokens takes: its fastest prefix."""
        steps = [self.sums.load(StepLoad(self.r, k, op_offload, pinned), walk.placed) for k in sizes]
        for step in steps:
            step.add_kv(kv_tier, kv_read(self.kv, step.parallel, self.s.parallel))
        # disk units first: on unified memory they need no link copy, and the last CPU-computed one
        # gone lets op offload back on for a large batch (StepLoad)
        # the whole walk, then its best prefix: the time is not convex along it (the first streamed unit
        # slows the CPU's batched matmuls, the last CPU-computed one lets op offload back on)
        return first_fastest(walk_seconds(steps, [self._moves(walk, k) for k in sizes]))

    def _moves(self, walk: _Walk, parallel: int) -> Moves:
        """The walk's moves at a step of `parallel` tokens: a unit's terms as StepLoad.add's, a layer's stacks
        their sums (stacks_move, once a step size: hundreds of experts a layer)."""
        read, flops = self.sums.terms(parallel)
        one = walk.units >= 0
        at = np.where(one, walk.units, 0)
        moved, moved_flops, link = read[at], flops[at], read[at]
        for j in np.flatnonzero(~one):
            moved[j], moved_flops[j], link[j] = self.stacks_move(int(walk.stages[j]), parallel)
        return Moves(moved, moved_flops, link, walk.disk)

    def stacks_move(self, stage: int, parallel: int) -> tuple[float, float, float]:
        """What streaming layer `stage`'s RAM expert stacks moves at a step of `parallel` tokens (StepLoad.move_stacks:
        the experts' bytes the step reads, their FLOPs, the stacks' whole bytes), summed once per step size."""
        key = (stage, parallel)
        if key not in self._stacks_moves:
            group = self.expert_groups[stage]
            read, flops = self.sums.terms(parallel)  # each expert's, as StepLoad.add takes them
            self._stacks_moves[key] = (sum(read[group].tolist()), sum(flops[group].tolist()),
                                       float(sum(self.mu.units[i].nbytes for i in group)))
        return self._stacks_moves[key]

    def ram_stacks(self, tiers) -> dict[int, list[int]]:
        """Layer -> its expert units, for the layers whose experts are all in RAM: the stacked tensors a step may
        stream whole into a GPU slot (with one on disk or the GPU they are paged or resident instead)."""
        return {s: g for s, g in self.expert_groups.items() if all(tiers[i] == RAM for i in g)}

    def solve(self, fill, use_gpu: bool, kv_tier: str, stream: bool, solver: str,
              op_offload: bool = True, pinned: bool = False) -> Solution | _Shortfall:
        """One config (_solve_config), solved once: the CPU-only config is asked with and without pinned weights,
        which it lacks, and the greedy baseline (search.greedy) after the optimizer's candidates that hold it."""
        key = (fill.__name__, use_gpu, kv_tier, stream, solver, op_offload, self._pinned(use_gpu, stream, pinned))
        if key not in self._solved:
            self._solved[key] = self._solve_config(fill, use_gpu, kv_tier, stream, solver, op_offload, pinned)
        return self._solved[key]

    def _pinned(self, use_gpu: bool, stream: bool, pinned: bool) -> bool:
        """CPU weights held pinned (plain layout): a plan that streams to a discrete GPU always (per-step paths copy
        them to slots), one that does not where asked (llama.cpp's -lm none); op offload then copies a batch's
        share at the link's rate (cost.py)."""
        return use_gpu and not self.r.unified and (stream or pinned)

    def _solve_config(self, fill, use_gpu: bool, kv_tier: str, stream: bool, solver: str,
                      op_offload: bool = True, pinned: bool = False) -> Solution | _Shortfall:
        """One config: fill and split with memory reservations (GPU pool slots, RAM staging, the
        host compute buffer) grown until what the placement needs fits in what was reserved.

        Grown, the staging can overshoot: a budget that pushes one large stage (the output head) to disk
        reserves prefetch depth + 1 slots of it, all of a small model. Where RAM falls short so, the staging
        is bounded instead (`staged`): the fewest slots given up, each as large as a stage that may stream."""
        sol = self._solve(fill, use_gpu, kv_tier, stream, solver, op_offload, pinned)
        if stream and isinstance(sol, _Shortfall) and sol.tier == GPU and self.expert_groups:
            # slots for whole expert stacks cost GPU memory a budget may lack: then the steps stream dense units only
            sol = self._solve(fill, use_gpu, kv_tier, stream, solver, op_offload, pinned, stacks=False)
        if not (isinstance(sol, _Shortfall) and sol.tier == RAM and self.b.disk):
            return sol
        short = [sol]
        for n in range(self.n_slots, 0, -1):
            tries = [self._solve(fill, use_gpu, kv_tier, stream, solver, op_offload, pinned, (n, reserve))
                     for reserve in staging_reserves(self, n)]
            fits = [alt for alt in tries if isinstance(alt, Solution)]
            if fits:
                return min(fits, key=lambda s: s.turn_s)
            short += tries
        return min(short, key=lambda c: c.need - c.have)

    def _solve(self, fill, use_gpu: bool, kv_tier: str, stream: bool, solver: str, op_offload: bool, pinned: bool,
               staged: tuple[int, int] | None = None, stacks: bool = True) -> Solution | _Shortfall:
        """staged: (slots, bytes) of RAM staging reserved up front (staging.staging_reserves), not grown: a
        placement whose disk layers need more falls short. stacks: steps may stream whole expert stacks (step_paths)."""
        b, units = self.b, self.mu.units
        pinned = self._pinned(use_gpu, stream, pinned)
        config = ((f"kv={kv_tier}, stream={'on' if stream else 'off'}" if use_gpu else "cpu only")
                  + (", CPU weights pinned" if pinned and not stream else "") + ("" if op_offload else ", op offload off"))
        gpu_fixed = (self.buf if use_gpu else 0) + (self.kv if kv_tier == GPU else 0)
        runtime = knobs.GPU_PROCESS_RAM if use_gpu else 0
        process = 0 if use_gpu else knobs.PROCESS_RAM  # GPU_PROCESS_RAM includes it
        ram_fixed = self.host_only + (self.kv if kv_tier == RAM else 0) + runtime + process
        # llama.cpp sizes the CPU's compute buffer by the graph splits the CPU runs: small when the GPU
        # computes every layer
        pool, staging, host_buf = 0, 0, (min(self.buf, knobs.HOST_BUFFER_OFFLOADED) if use_gpu else self.cpu_buf)
        n_stage = staged[0] if staged else self.n_slots
        if staged:
            staging = staged[1] + (max(1, self.r.disk_readers) - 1) * knobs.STREAM_READER_RAM
        for _ in range(32):
            gpu_cap = b.gpu - gpu_fixed - pool if use_gpu else 0
            ram_cap = b.ram - ram_fixed - host_buf - staging - ((gpu_fixed + pool) if b.unified else 0)
            if gpu_cap < 0 or ram_cap < 0:
                return self._shortfall(gpu_cap < 0, use_gpu, kv_tier, gpu_fixed + pool, b.ram - ram_cap,
                                       pool, staging, host_buf)
            tiers = fill(gpu_cap, ram_cap)
            at_tier = codes(tiers)
            if np.any(on_disk := self.sums.resident & (at_tier == CODE[DISK])):  # it cannot stream (Unit.resident)
                return self._shortfall(False, use_gpu, kv_tier, 0, b.ram - ram_cap + self.sums.bytes_in(on_disk)
                                       + self.sums.bytes_in((at_tier == CODE[RAM]) & ~self.sums.host_only), pool,
                                       staging, host_buf)
            compute = (self.split(tiers, kv_tier, op_offload, pinned=pinned) if stream
                       else [GPU if t == GPU else CPU for t in tiers])
            # with a GPU to stream to, each step size has its own path for RAM units; slots hold any of them
            steps = self.step_paths(tiers, kv_tier, op_offload, compute, pinned, stacks) if stream else ()
            compute = path_at(compute, tiers, steps, self.s.parallel)
            on_cpu = codes(compute) == CODE[CPU]
            ever = path_at(compute, tiers, steps, None)
            slots = self.slots_need(at_tier, ever, lambda t, c: t != GPU and c == GPU)
            slots = [max(slots)] * len(slots) if slots else slots  # every slot as large as the largest layer
            stages = staging_slots(self, at_tier, compute, n_stage)
            cpu_work = bool(np.any(on_cpu & ~self.sums.host_only))
            need_host = (self.buf if use_gpu else self.cpu_buf) if cpu_work else host_buf
            # host-pool slots hold ggml's plain layout (the runtime turns llama.cpp's repacking off beside them),
            # read by disk_readers readers at once, each with its own request buffer (paged experts: the pager's)
            dense_disk = bool(np.any((at_tier == CODE[DISK]) & on_cpu & ~self.sums.expert & ~self.sums.host_only))
            readers = (max(1, self.r.disk_readers) - 1) * knobs.STREAM_READER_RAM if dense_disk else 0
            if sum(slots) <= pool and sum(stages) + readers <= staging and need_host <= host_buf:
                break
            if staged and sum(stages) + readers > staging:
                return self._shortfall(False, use_gpu, kv_tier, 0, b.ram - ram_cap + sum(stages) + readers - staging,
                                       pool, sum(stages) + readers, host_buf)
            pool, staging, host_buf = (max(pool, sum(slots)), max(staging, sum(stages) + readers),
                                       max(host_buf, need_host))
        else:
            return self._shortfall(False, use_gpu, kv_tier, 0, b.ram + 1, pool, staging, host_buf)
        weights = {tier: self.sums.bytes_in(at_tier == CODE[tier]) for tier in (GPU, RAM, DISK)}
        disk_left = weights[DISK]
        if disk_left and not b.disk:
            return _Shortfall("gpu+ram", b.gpu + b.ram + disk_left, b.gpu + b.ram, "disk streaming off")
        memory = {
            GPU: {"weights": weights[GPU], "kv": self.kv if kv_tier == GPU else 0,
                  "compute": self.buf if use_gpu else 0, "pool": sum(slots)},
            RAM: {"weights": weights[RAM], "kv": self.kv if kv_tier == RAM else 0,
                  "compute": need_host, "staging": sum(stages), "runtime": runtime, "process": process + readers},
            DISK: {"weights": weights[DISK]},
        }
        tr = traffic(self.mu, tiers, compute, kv_tier, self.kv, self.r, self.s.n_ubatch, self.s.parallel, op_offload,
                     pinned)
        prediction = predict(tr, self.r)

        def at(k: int) -> Prediction:
            return predict_step(self.mu, tiers, compute, steps, kv_tier, kv_read(self.kv, k, self.s.parallel), self.r,
                                self.s.n_ubatch, k, op_offload, pinned)

        if steps:  # a prompt's micro-batch is one more step, with its own path: all RAM layers streamed, mostly
            batch = at(self.s.n_ubatch)
            # and its attention, on the device of the KV cache (a step's cost model counts the cache's reads only)
            attn = attention_flops(self.mu, self.kv, self.s.n_ubatch)
            attn_s = attn / ((self.r.gpu_flops or knobs.GPU_FLOPS_DEFAULT) if kv_tier == GPU else self.r.cpu_flops)
            step_s = self.s.n_ubatch / batch.decode_tok_s if batch.decode_tok_s > 0 else float("inf")
            # op offload's copies cross the link too, one after the other with the compute
            limit = ({"offload": "link"}.get(batch.decode_limit, batch.decode_limit)
                     if batch.decode_limit in ("link", "disk", "offload") and attn_s < step_s else "compute")
            sec = batch.seconds
            parts = {"compute": sec["gpu"] + sec["cpu"] + sec["overhead"] + attn_s, "fixed": sec.get("offload", 0.0),
                     "link": sec["link"], "disk": sec["disk"]}
            prediction = dataclasses.replace(prediction, prefill_tok_s=self.s.n_ubatch / (step_s + attn_s),
                                             prefill_limit=limit, prefill_parts=parts)
        one = None
        if self.s.parallel > 1:  # the plan serves one sequence too: its step's own path, its own prediction
            one = at(1)
        return Solution(tuple(tiers), tuple(compute), kv_tier, max(slots), max(stages, default=0), memory, tr, prediction,
                        solver, config + (f", {n_stage} staging slot(s)" if staged else ""), steps, one,
                        stage_slots=n_stage if staged else 0, at=at)

    def step_paths(self, tiers: list[str], kv_tier: str, op_offload: bool, base: list[str],
                   pinned: bool = False, stacks: bool = True) -> tuple:
        """((tokens, RAM units streamed at that step size), ...) for each of step_sizes:
        the CPU computes few tokens from RAM faster than the link streams the bytes, a batch the other way."""
        in_ram = codes(tiers) == CODE[RAM]
        if not (np.any(in_ram & ~self.sums.host_only & ~self.sums.expert) or (stacks and self.ram_stacks(tiers))):
            return ()
        walk = self._walk(tiers, base, stacks)  # its moves are RAM units alone, computed by the CPU at its start
        sizes = step_sizes(self.s.n_ubatch, self.s.parallel)
        taken = self._best_prefixes(walk, kv_tier, op_offload, sizes, pinned)
        return tuple((k, tuple(sorted(i for group in walk.moves[:n] for i in group))) for k, n in zip(sizes, taken))

    def _shortfall(self, on_gpu: bool, use_gpu: bool, kv_tier: str, gpu_need: int, ram_need: int,
                   pool: int, staging: int, host_buf: int) -> _Shortfall:
        kv = fmt_size(self.kv)
        if on_gpu:
            parts = f"KV cache {kv}, compute buffer {fmt_size(self.buf)}, stream slots {fmt_size(pool)}"
            return _Shortfall(GPU, gpu_need, self.b.gpu, parts)
        parts = (f"input embeddings {fmt_size(self.host_only)}, compute buffer {fmt_size(host_buf)}, "
                 f"disk staging {fmt_size(staging)}" + (f", KV cache {kv}" if kv_tier == RAM else "")
                 + (f", CUDA runtime {fmt_size(knobs.GPU_PROCESS_RAM)}" if use_gpu
                    else f", process {fmt_size(knobs.PROCESS_RAM)}")
                 + (", GPU bytes (unified memory)" if self.b.unified and use_gpu else ""))
        return _Shortfall(RAM, ram_need, self.b.ram, parts)

    def configs(self, streams: tuple[bool, ...]) -> list[tuple[bool, str, bool]]:
        """(use GPU, KV tier, stream) to try: GPU configs first, so ties favour using the GPU; the
        CPU-only config stays a candidate (a GPU budget too small for its buffers, tiny models)."""
        gpu = [(True, kv, st) for st in streams for kv in (GPU, RAM)] if self.gpu_usable else []
        return gpu + [(False, RAM, False)]


_NAMES = np.array(sorted(CODE, key=CODE.get), dtype=object)  # CODE's names, by code


def _spread_order(stages: list[int]) -> dict[int, float]:
    """Rank of each stage in van der Corput order (bit-reversed index): 0, 1/2, 1/4, 3/4, ..."""
    def reverse_bits(k: int) -> float:
        x, f = 0.0, 0.5
        while k:
            x, k, f = x + f * (k & 1), k >> 1, f / 2
        return x
    return {s: reverse_bits(k) for k, s in enumerate(stages)}
