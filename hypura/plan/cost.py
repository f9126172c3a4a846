"""The cost model: one function from bytes moved per path to predicted tok/s.

Decode, per step: each of `parallel` sequences (llama.cpp's n_seq_max, the engine's batch) adds one
token. Every path moves its bytes concurrently (copies and disk reads are issued layers ahead by the
prefetcher), but GPU and CPU compute run one after the other, because layer L+1 needs layer L's output:

    step = max(gpu time + cpu time + op-offload copies + clash + paged experts' reads + fixed costs,
               streamed copies + op-offload copies + clash, disk_bytes/disk_rate,
               (cpu_bytes + link_bytes)/(RAM the two share));
    aggregate decode tok/s = parallel / step

Op offload's copies (below) run on the compute stream, each before its matmul, so they add to the compute; the
streamed ones fill slots on a copy stream, overlapped with it; both cross the one link. A step that mixes the two
loses `clash` (knobs.COPY_CLASH of the shorter) on both terms: measured, such a step took longer than either, so
where the link binds the best step streams all of a layer kind or none.

Experts read from disk where the routers send decode (paged) are the exception to the overlap: each is
read after its layer's router and before its matmul, so the compute waits for it.

A device's time is its weight bytes at its read rate (measured by one-token decode, that token's
compute included) plus the FLOPs of the step's other tokens at its matmul rate (the CPU's sum divided by
the gain the profile measured for such a step on the model's blocks, Rates.cpu_gain: the tokens share reads more
than the sum says): CPU matmuls turn FLOP-bound within a few tokens, while a streamed or disk-read layer's bytes are paid once a step
whatever the batch, so a batch moves the best split toward GPU compute. A batch also widens what a
step reads of an MoE layer: each expert with probability 1 - (1 - p)^parallel, under uniform routing
n_expert * (1 - (1 - k/n_expert)^parallel) distinct experts of a layer; a layer's RAM experts streamed into a
GPU slot go whole, as their stacked tensors (`streamed_bytes`), so the link carries every expert's bytes. From OP_OFFLOAD_MIN_BATCH
tokens on, llama.cpp's op offload computes CPU-resident weights on the GPU after copying them (of a
stacked expert tensor, the experts the step selects: ggml-backend.cpp) every step: from pageable memory at
PAGEABLE_LINK_DEFAULT-like rates, why vanilla's batched decode of a partly offloaded model is slower at 32
sequences than at 16; from pinned memory (a plan that streams to the GPU holds its CPU weights pinned, and
another candidate does without streaming: `host_pinned`) at the link's rate, read by the CPU at its plain-layout rate. The runtime turns op offload off
beside CPU weights that hooks fill mid-graph (disk-tier ones).

For one sequence and the hybrid (the CPU computes some non-resident layers while the link streams
others into GPU slots) this gives the hybrid's bound (docs/design.md): non-resident bytes / (CPU rate + link rate).
Prefill, per micro-batch of n_ubatch tokens: llama.cpp offloads every matmul of a batch >= 32 to the GPU,
copying host weights over the link (streamed ones and pinned CPU ones at the link's rate, CPU-resident ones as
llama.cpp holds them from pageable memory); op offload copies on the compute stream, one weight and then its
matmul, where streamed slots fill on a copy stream beside the compute, so
time = max(FLOPs/rate + op offload's copies, streamed bytes/link rate, disk bytes/disk rate), an expert's bytes
counted when any of the
micro-batch's tokens selects it (1 - (1 - p)^n_ubatch of them: at 512 tokens and more, nearly all of a layer's
experts), so a prompt's link time per token falls with the micro-batch until FLOPs bind; plan/microbatch.py
grows it where that pays. Beside CPU-computed weights from
disk the runtime turns that offload off: the CPU's units then add their FLOPs at the CPU's rate, and
their bytes leave the link.

`traffic()` turns a placement into `Traffic` (through `StepLoad`, which the solver also updates unit by
unit); `hypura bench --parallel` calls the same `traffic()` and `predict()` for the prediction it prints
beside a measurement. The bound it prints too (hypura/speed/bound.py) is this model's bytes alone: each
path's bytes at its rate (`bytes_seconds`), experts by `step_probability`, no compute and no fixed costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypura.plan import knobs
from hypura.step_time import batch_compute_s, seconds_at, step_probability  # noqa: F401  (shared with the profile)
from hypura.units import ModelUnits
from hypura.tiers.names import CPU, DISK, GPU, RAM  # noqa: F401  (re-exported: the plan speaks them)

PATHS = ("gpu", "cpu", "link", "disk")


@dataclass(frozen=True)
class Rates:
    """Rates in bytes/s (FLOP/s for *_flops). No GPU: gpu_read None. Unified memory (Apple): the
    GPU shares RAM, disk reads land in GPU slots directly and `link` is a RAM copy."""

    cpu_read: float
    disk_read: float
    cpu_flops: float = knobs.CPU_FLOPS_DEFAULT
    gpu_read: float | None = None
    link: float | None = None
    gpu_flops: float | None = None
    unified: bool = False
    gpu_layer_s: float = knobs.GPU_LAYER_S
    cpu_layer_s: float = knobs.CPU_LAYER_S
    split_s: float = knobs.SPLIT_S
    stream_split_s: float = knobs.STREAM_SPLIT_S  # when layers stream (the compute hooks are on)
    disk_readers: int = 1  # concurrent O_DIRECT readers that read fastest (the profile's best thread count)
    expert_disk_read: float | None = None  # random expert-sized reads (None: an older profile; disk_read)
    pageable_link: float | None = None  # host->GPU copies from pageable memory (llama.cpp's op offload)
    # the CPU's decode rate from weights in ggml's plain layout (pinned, or beside hook-filled buffers): where
    # llama.cpp repacks (x86 AVX2/AVX-512, ARM) the measured cpu_read is the repacked layout's. None: cpu_read
    cpu_read_plain: float | None = None
    # ((tokens, gain), ...): the profile's batched steps on the model's blocks ran this much faster than
    # batch_compute_s says (CpuCompute.batch_gain); (): none measured
    cpu_batch_gain: tuple = ()

    def __post_init__(self):
        # from a plan's JSON: lists
        object.__setattr__(self, "cpu_batch_gain", tuple((int(k), float(g)) for k, g in self.cpu_batch_gain))

    def disk_seconds(self, nbytes: float, expert_bytes: float = 0.0) -> float:
        """Seconds to read nbytes from disk, of which expert_bytes are experts read where routers send
        decode (random reads, slower than the sequential requests of the rest)."""
        return _div(nbytes - expert_bytes, self.disk_read) + _div(expert_bytes, self.expert_disk_read or self.disk_read)

    def link_beside(self, cpu_bytes: float) -> float | None:
        """The link's rate when the CPU decodes `cpu_bytes` of weights a token at the same time (both read RAM)."""
        return self.link * knobs.LINK_BESIDE_CPU if self.link and cpu_bytes > 0 and not self.unified else self.link

    @property
    def pageable_rate(self) -> float:
        return self.pageable_link or knobs.PAGEABLE_LINK_DEFAULT

    def cpu_rate(self, pinned: bool) -> float:
        """The CPU's decode rate from host weights held pinned (plain layout) or as llama.cpp holds them."""
        return (self.cpu_read_plain or self.cpu_read) if pinned else self.cpu_read

    def cpu_gain(self, tokens: int) -> float:
        """How much faster than batch_compute_s the CPU runs a step of `tokens` tokens: 1 at one token (its rate is
        the measured one), the profile's measured steps, log-linear between them. Beyond the last (a prompt's), what
        the sum counts twice (the step's bytes, read once all experts are) stays while its FLOPs grow with the
        tokens: the gain falls back toward 1 as last/tokens."""
        points = [(1, 1.0), *sorted(self.cpu_batch_gain)]
        if tokens <= 1:
            return 1.0
        for (k0, g0), (k1, g1) in zip(points, points[1:]):
            if tokens <= k1:
                return g0 * (g1 / g0) ** (math.log(tokens / k0) / math.log(k1 / k0))
        k, g = points[-1]
        return 1.0 + (g - 1.0) * k / tokens

    def host_copy_rate(self, pinned: bool) -> float:
        """Op offload's copies of host weights to the GPU: from pinned memory at the link's rate."""
        return self.link if pinned and self.link else self.pageable_rate

    @property
    def has_gpu(self) -> bool:
        return self.gpu_read is not None

    @property
    def can_stream_to_gpu(self) -> bool:
        return self.has_gpu and (self.unified or bool(self.link))


@dataclass(frozen=True)
class Traffic:
    """Bytes per decode step (one token of each of `parallel` sequences) on each path, and per prefill
    micro-batch of n_ubatch tokens."""

    gpu_bytes: float = 0.0  # read by GPU compute: resident weights, filled slots, KV
    cpu_bytes: float = 0.0  # read by CPU compute
    link_bytes: float = 0.0  # copied host -> GPU slots
    disk_bytes: float = 0.0  # read from disk (O_DIRECT)
    expert_disk_bytes: float = 0.0  # of disk_bytes, experts (random reads)
    gpu_layers: int = 0  # layers with GPU work: each pays a fixed cost
    cpu_layers: int = 0
    splits: int = 0  # CPU<->GPU hand-offs in one token's graph
    n_ubatch: int = knobs.N_UBATCH
    prefill_flops: float = 0.0
    prefill_link_bytes: float = 0.0
    prefill_disk_bytes: float = 0.0
    prefill_on_gpu: bool = False  # a plan that uses the GPU computes batches there (op_offload)
    prefill_cpu_flops: float = 0.0  # of prefill_flops, what the CPU computes all the same (op_offload off)
    prefill_offload_bytes: float = 0.0  # of prefill_link_bytes, CPU-resident weights copied from pageable memory
    parallel: int = 1  # tokens a decode step carries, one per sequence
    decode_gpu_flops: float = 0.0  # a step's FLOPs (all its tokens) computed by the GPU
    decode_cpu_flops: float = 0.0
    offload_bytes: float = 0.0  # host weights op offload copies to the GPU every step (parallel >= 32)
    op_offload: bool = True  # llama.cpp's op offload as the plan wants it (plan/load_params.py applies False)
    # CPU-computed RAM weights held in pinned host memory, plain layout (a plan that streams to the GPU, or the
    # pinned candidate, plan/solve.py): the CPU reads them at Rates.cpu_read_plain, op offload copies them at the
    # link's rate
    host_pinned: bool = False
    cpu_row_bytes: float = 0.0  # of cpu_bytes, the input embeddings' rows (get_rows: no decode beside the link)


@dataclass(frozen=True)
class Prediction:
    decode_tok_s: float  # aggregate: every sequence's tokens
    decode_limit: str  # which path bounds a step: gpu | cpu | offload (op offload's copies) | link | disk | ram
    prefill_tok_s: float
    prefill_limit: str  # compute | link | disk
    seconds: dict = field(default_factory=dict)  # per decode step, per path (+ "overhead")
    bytes_per_token: dict = field(default_factory=dict)  # per decode step (one token when parallel is 1)
    parallel: int = 1
    # a full prompt micro-batch's seconds: "compute" (its matmuls: their share of a shorter micro-batch), "fixed"
    # (op offload's copies, beside the compute), "link" and "disk" (the streamed bytes, a step's whole); {}: unknown
    prefill_parts: dict = field(default_factory=dict)
    n_ubatch: int = 0

    def prompt_seconds(self, tokens: int) -> float:
        """Seconds of a prompt of `tokens`: full micro-batches, then a shorter one that moves the same weights (a
        prompt's tokens select nearly every expert) and computes its share of the matmuls."""
        if not self.prefill_parts or not self.n_ubatch:
            return tokens / self.prefill_tok_s if self.prefill_tok_s > 0 else float("inf")
        full, rest = divmod(tokens, self.n_ubatch)
        p = self.prefill_parts

        def batch(share: float) -> float:
            return max(p["compute"] * share + p["fixed"], p["link"], p["disk"])

        # held to the predicted rate at a full micro-batch (a step table's prediction adds its attention after)
        scale = self.n_ubatch / self.prefill_tok_s / batch(1.0) if batch(1.0) > 0 and self.prefill_tok_s > 0 else 1.0
        return scale * (full * batch(1.0) + (batch(rest / self.n_ubatch) if rest else 0.0))

    def gbps(self) -> dict:
        """Each path's rate at the predicted tok/s, GB/s: the headline a streaming engine prints."""
        return {k: v * self.decode_tok_s / self.parallel / 1e9 for k, v in self.bytes_per_token.items()}


_div = seconds_at


def bytes_seconds(nbytes: dict, r: Rates, expert_disk: float = 0.0, pinned: bool = False) -> dict:
    """Each path's seconds for its bytes alone at its rate (PATHS' keys; a path without a rate moves nothing):
    no compute, no fixed costs, no path slowed by another, the bound hypura/speed/bound.py prints. pinned: the
    CPU's weights are held pinned (Traffic.host_pinned), read at its plain-layout rate."""
    return {CPU: nbytes[CPU] / r.cpu_rate(pinned), "link": nbytes["link"] / r.link if r.link else 0.0,
            "disk": r.disk_seconds(nbytes["disk"], expert_disk),
            GPU: nbytes[GPU] / r.gpu_read if r.gpu_read else 0.0}


def decode_seconds(gpu: float, gpu_flops: float, cpu: float, cpu_flops: float, offload: float, link: float,
                   disk: float, expert_disk: float, r: Rates, parallel: int, pinned: bool = False,
                   rows: float = 0.0) -> dict:
    """Seconds of one decode step on each path, fixed costs left out (predict adds them); pinned: host weights
    are held pinned (Traffic.host_pinned); rows: of cpu, the input embeddings' rows (get_rows, host_only)."""
    offload_s, streamed_s = _div(offload, r.host_copy_rate(pinned)), _div(link, r.link_beside(cpu - rows))
    # the two kinds of copies share the link and hinder each other: what a step that mixes them loses, on the
    # compute stream and on the link alike (so a step streams all of a kind where the link binds)
    clash = knobs.COPY_CLASH * min(offload_s, streamed_s)
    return {GPU: batch_compute_s(gpu, gpu_flops, r.gpu_read, r.gpu_flops or knobs.GPU_FLOPS_DEFAULT, parallel),
            CPU: batch_compute_s(cpu, cpu_flops, r.cpu_rate(pinned),
                                 r.cpu_flops * (knobs.CPU_BATCH_FLOPS_BESIDE_STREAMING if link > 0 else 1.0), parallel)
            / r.cpu_gain(parallel),
            # op offload copies a weight on the compute stream right before its matmul: serial with the compute
            "offload": offload_s + clash,
            # the link carries both kinds: streamed slots fill on a copy stream beside the compute, op offload's
            # copies hold it while they run; embedding rows the CPU gathers (`rows`) are no decode beside them
            "link": streamed_s + offload_s + clash,
            "disk": r.disk_seconds(disk, expert_disk),
            # experts read where the routers send decode are read after the router and before their matmuls: the
            # compute waits for them: a paged step is the sum of the two, not the larger
            "paged": _div(expert_disk, r.expert_disk_read or r.disk_read),
            # both read RAM: with the CPU busy too, the two share its bandwidth (knobs.RAM_SHARED_HEADROOM)
            "ram": _div(cpu + link, r.cpu_rate(pinned) * knobs.RAM_SHARED_HEADROOM) if cpu > 0 and link > 0
            and not r.unified else 0.0}


def streamed_bytes(u, tier: str, used: float, sign: int = 1) -> float:
    """What the link carries for a unit streamed into a GPU slot when a step reads `used` of its bytes: a RAM
    expert streams with its layer's whole stacked tensors (one buffer, copied whole into a slot: plan/pools.py),
    so every expert's bytes cross, read or not; anything else only what is read."""
    return sign * u.nbytes if u.expert >= 0 and tier == RAM else used


@dataclass
class StepLoad:
    """What one decode step of `parallel` tokens asks of each path, summed unit by unit: traffic() adds
    every unit, the solver moves units between devices with add(..., sign=-1) and add(...). CPU-computed
    units in RAM are kept apart (`host`): from OP_OFFLOAD_MIN_BATCH tokens on, op offload computes them
    on the GPU after a pageable copy, unless a disk-tier unit is CPU-computed (the runtime turns it off) or
    the plan turns it off; llama.cpp does so on a GPU machine whatever the plan computes there (-ngl 0 too)."""

    rates: Rates
    parallel: int
    op_offload_on: bool = True  # llama.cpp's context setting op_offload, as the plan leaves it
    pinned: bool = False  # CPU-computed RAM weights held pinned (Traffic.host_pinned)
    gpu: float = 0.0
    gpu_flops: float = 0.0
    cpu: float = 0.0
    cpu_flops: float = 0.0
    host: float = 0.0
    host_flops: float = 0.0
    # what op offload copies: llama.cpp's scheduler copies the experts a step's tokens select, not the whole stack
    host_copy: float = 0.0
    link: float = 0.0
    disk: float = 0.0
    expert_disk: float = 0.0
    disk_cpu: int = 0  # CPU-computed disk-tier units
    rows: float = 0.0  # of cpu: the input embeddings' rows a step gathers (host_only units)

    def add(self, u, tier: str, dev: str, sign: int = 1) -> None:
        a = sign * step_probability(u.p, self.parallel) * u.nbytes
        f = 0.0 if u.host_only else sign * 2.0 * self.parallel * u.elements * u.p  # get_rows: no matmul
        if tier == DISK:
            self.disk += a
            self.expert_disk += a if u.expert >= 0 else 0.0
            self.disk_cpu += sign if dev == CPU and not u.host_only else 0
        if dev == GPU:
            self.gpu, self.gpu_flops = self.gpu + a, self.gpu_flops + f
            if tier == RAM or (tier == DISK and not self.rates.unified):
                self.link += streamed_bytes(u, tier, a, sign)
        elif tier == RAM and not u.host_only:
            self.host, self.host_flops = self.host + a, self.host_flops + f
            self.host_copy += a
        else:
            self.cpu, self.cpu_flops = self.cpu + a, self.cpu_flops + f
            self.rows += a if u.host_only else 0.0

    def move_stacks(self, read: float, flops: float, whole: float) -> None:
        """A layer's RAM expert stacks from the CPU's compute to a GPU slot: what add(u, RAM, CPU, -1) then
        add(u, RAM, GPU) does for each of its experts, from their sums (_Problem.stacks_move)."""
        self.host, self.host_flops, self.host_copy = self.host - read, self.host_flops - flops, self.host_copy - read
        self.gpu, self.gpu_flops, self.link = self.gpu + read, self.gpu_flops + flops, self.link + whole

    def add_kv(self, kv_tier: str, kv_bytes: float) -> None:
        if kv_tier == GPU:
            self.gpu += knobs.KV_READ_FILL * kv_bytes
        else:
            self.cpu += knobs.KV_READ_FILL * kv_bytes

    @property
    def op_offload(self) -> bool:
        return (self.op_offload_on and self.rates.has_gpu and not self.rates.unified and self.disk_cpu == 0
                and self.parallel >= knobs.OP_OFFLOAD_MIN_BATCH)

    def paths(self) -> dict:
        """Per-path bytes and FLOPs with the host units where llama.cpp computes them."""
        if self.op_offload:
            return dict(gpu=self.gpu + self.host, gpu_flops=self.gpu_flops + self.host_flops, cpu=self.cpu,
                        cpu_flops=self.cpu_flops, offload=self.host_copy)
        return dict(gpu=self.gpu, gpu_flops=self.gpu_flops, cpu=self.cpu + self.host,
                    cpu_flops=self.cpu_flops + self.host_flops, offload=0.0)

    def seconds(self) -> float:
        """The step's time without fixed costs: what the solver's split minimises."""
        s = decode_seconds(**self.paths(), link=self.link, disk=self.disk, expert_disk=self.expert_disk,
                           r=self.rates, parallel=self.parallel, pinned=self.pinned, rows=self.rows)
        return max(s[GPU] + s[CPU] + s["offload"] + s["paged"], s["link"], s["disk"], s["ram"])


def predict(t: Traffic, r: Rates) -> Prediction:
    s = decode_seconds(t.gpu_bytes, t.decode_gpu_flops, t.cpu_bytes, t.decode_cpu_flops, t.offload_bytes,
                       t.link_bytes, t.disk_bytes, t.expert_disk_bytes, r, t.parallel, t.host_pinned, t.cpu_row_bytes)
    gpu_fixed, cpu_fixed = t.gpu_layers * r.gpu_layer_s, t.cpu_layers * r.cpu_layer_s
    streaming = t.link_bytes > 0 or t.disk_bytes > 0
    overhead = gpu_fixed + cpu_fixed + t.splits * (r.stream_split_s if streaming else r.split_s)
    paths = {"compute": s[GPU] + s[CPU] + s["offload"] + s["paged"] + overhead, "link": s["link"], "disk": s["disk"],
             "ram": s["ram"]}
    limit = max(paths, key=paths.get)
    if limit == "compute":
        parts = {GPU: s[GPU] + gpu_fixed, CPU: s[CPU] + cpu_fixed, "offload": s["offload"], "disk": s["paged"]}
        limit = max(parts, key=parts.get)  # max() keeps the first of equals: gpu
    step_s = max(paths.values())

    if t.prefill_on_gpu:
        pre_compute = _div(t.prefill_flops - t.prefill_cpu_flops, r.gpu_flops) + _div(t.prefill_cpu_flops, r.cpu_flops)
    else:
        pre_compute = _div(t.prefill_flops, r.cpu_flops)
    # op offload copies a CPU weight on the compute stream right before its matmul: its copies add to the compute;
    # streamed slots fill on the copy stream while the GPU computes the layers before: they overlap it
    offload_s = _div(t.prefill_offload_bytes, r.host_copy_rate(t.host_pinned))
    link_s, disk_s = _div(t.prefill_link_bytes - t.prefill_offload_bytes, r.link), _div(t.prefill_disk_bytes, r.disk_read)
    pre = {"compute": pre_compute + offload_s, "link": link_s, "disk": disk_s}
    pre_limit = max(pre, key=pre.get)
    if pre_limit == "compute" and offload_s > pre_compute:
        pre_limit = "link"  # op offload's copies, more of the bound than the matmuls
    batch_s = max(pre.values())
    nbytes = {"gpu": t.gpu_bytes, "cpu": t.cpu_bytes, "link": t.link_bytes, "disk": t.disk_bytes}
    seconds = {"gpu": s[GPU], "cpu": s[CPU], "link": s["link"], "disk": s["disk"], "overhead": overhead}
    if s["ram"]:
        seconds["ram"] = s["ram"]
    if t.offload_bytes:
        nbytes["offload"], seconds["offload"] = t.offload_bytes, s["offload"]
    return Prediction(
        decode_tok_s=t.parallel / step_s if step_s > 0 else float("inf"),
        decode_limit=limit,
        prefill_tok_s=t.n_ubatch / batch_s if batch_s > 0 else float("inf"),
        prefill_limit=pre_limit, seconds=seconds, bytes_per_token=nbytes, parallel=t.parallel,
        prefill_parts={"compute": pre_compute, "fixed": offload_s, "link": link_s, "disk": disk_s}, n_ubatch=t.n_ubatch,
    )


def attention_flops(mu: ModelUnits, kv_bytes: int, n_ubatch: int) -> float:
    """FLOPs of a micro-batch's attention in a long prompt (knobs.MICROBATCH_PROMPT_TOKENS, at most one sequence's
    cells of the cache): each token reads K and V of the positions before it, half the prompt on average."""
    d = mu.dims
    per_cell = d.n_layer * d.kv_bytes_per_layer(1)
    cells = kv_bytes / per_cell if per_cell > 0 else 0.0
    context = min(float(knobs.MICROBATCH_PROMPT_TOKENS), cells) / 2
    return 2.0 * n_ubatch * d.n_layer * d.n_head * (d.head_k + d.head_v) * context


def traffic(mu: ModelUnits, tiers: Sequence[str], compute: Sequence[str], kv_tier: str, kv_bytes: int,
            rates: Rates, n_ubatch: int = knobs.N_UBATCH, parallel: int = 1, op_offload: bool = True,
            pinned: bool = False) -> Traffic:
    """Bytes per path of a placement: `tiers[i]` (gpu|ram|disk) and `compute[i]` (gpu|cpu) of
    unit i; a dense unit is read every step, an expert when any of the step's `parallel` tokens selects
    it (each with its probability p). op_offload False: the plan turns llama.cpp's op offload off (a batch's
    CPU units then compute on the CPU, prompts too). pinned: Traffic.host_pinned."""
    on_gpu = rates.has_gpu and GPU in compute
    step = StepLoad(rates, parallel, op_offload, pinned)
    for u, tier, dev in zip(mu.units, tiers, compute):
        step.add(u, tier, dev)
    step.add_kv(kv_tier, kv_bytes)
    offloaded = step.op_offload  # a step's host units computed on the GPU: one graph split with its units
    pre_link = pre_disk = flops = 0.0
    cpu_flops = cpu_link = 0.0  # what op offload would move to the GPU in a batch: CPU units' flops and bytes
    layer_devs: dict[tuple[int, int], set[str]] = {}
    for u, tier, dev in zip(mu.units, tiers, compute):
        if u.host_only:
            continue  # get_rows of one embedding row: no matmul, no batch copy
        unit_flops = 2.0 * n_ubatch * u.elements * u.p
        flops += unit_flops
        used = u.nbytes * (1.0 - (1.0 - u.p) ** n_ubatch)  # an expert: used by any token
        touched = streamed_bytes(u, tier, used) if dev == GPU else used
        if tier == DISK:
            pre_disk += touched
        if tier == RAM or (tier == DISK and not rates.unified):
            pre_link += touched  # only counted when the GPU computes the batch (below)
            if dev == CPU:
                cpu_flops, cpu_link = cpu_flops + unit_flops, cpu_link + touched
        part = 0 if u.role in ("attn", "norm", "other") else 1
        layer_devs.setdefault((u.stage, part), set()).add(GPU if offloaded and tier == RAM else dev)
    # attention runs where the KV cache is, between the projections (q, k, v before; output after)
    kv_dev = kv_tier if kv_tier == GPU else CPU
    # and a prompt's attention grows with it: beside a KV cache in RAM the CPU computes it (without flash
    # attention): l70 at 8 GiB, 2048 tokens: 30 s where the GPU took 2.5 (bench/RESULTS.md prefill-house)
    attn = attention_flops(mu, kv_bytes, n_ubatch)
    flops += attn
    for (stage, part), devs in list(layer_devs.items()):
        if part == 0:
            layer_devs[(stage, 0.25)], layer_devs[(stage, 0.5)] = {kv_dev}, set(devs)

    sequence = [d for key in sorted(layer_devs) for d in sorted(layer_devs[key])]
    splits = sum(a != b for a, b in zip(sequence, sequence[1:]))
    # the runtime turns op offload off beside CPU weights that hooks fill mid-graph (disk-tier ones), the plan
    # may too: then the CPU computes every CPU unit of a batch too, and none of their bytes cross the link
    offload_off = on_gpu and (not op_offload or any(tier == DISK and dev == CPU for tier, dev in zip(tiers, compute)))
    if offload_off:
        pre_link -= cpu_link
    layers = {GPU: set(), CPU: set()}
    for (layer, _), devs in layer_devs.items():
        for d in devs:
            layers[d].add(layer)
    paths = step.paths()
    return Traffic(
        gpu_bytes=paths["gpu"], cpu_bytes=paths["cpu"], link_bytes=step.link, disk_bytes=step.disk,
        expert_disk_bytes=step.expert_disk,
        gpu_layers=len(layers[GPU]), cpu_layers=len(layers[CPU]), splits=splits,
        n_ubatch=n_ubatch, prefill_flops=flops, prefill_link_bytes=pre_link if on_gpu else 0.0,
        prefill_disk_bytes=pre_disk, prefill_on_gpu=on_gpu,
        prefill_cpu_flops=(cpu_flops if offload_off else 0.0) + (attn if kv_dev == CPU and on_gpu else 0.0),
        # CPU-resident weights sit in pageable host memory; on unified memory the GPU reads RAM as it is
        prefill_offload_bytes=cpu_link if on_gpu and not offload_off and not rates.unified else 0.0,
        parallel=parallel, decode_gpu_flops=paths["gpu_flops"], decode_cpu_flops=paths["cpu_flops"],
        offload_bytes=paths["offload"], op_offload=op_offload, host_pinned=pinned, cpu_row_bytes=step.rows,
    )
