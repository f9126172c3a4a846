"""The cost model: one function from bytes moved per path to predicted tok/s.

Decode, per token: every path moves its bytes concurrently (copies and disk reads are issued
layers ahead by the prefetcher), but GPU and CPU compute run one after the other, because layer
L+1 needs layer L's output. So

    time = max(gpu_bytes/gpu_rate + cpu_bytes/cpu_rate + fixed costs,  link_bytes/link_rate,
               disk_bytes/disk_rate)

which for the hybrid (CPU computes some non-resident layers while the link streams others into
GPU slots) gives DESIGN.md's bound: non-resident bytes / (CPU rate + link rate).
Prefill, per micro-batch: llama.cpp offloads every matmul of a batch >= 32 to the GPU, copying
host weights over the link, so time = max(FLOPs/rate, link bytes/link rate, disk bytes/disk rate).
Beside CPU-computed weights from disk the runtime turns that offload off: the CPU's units then add
their FLOPs at the CPU's rate, and their bytes leave the link.

`traffic()` turns a placement into `Traffic`; the runtime and `bench` build `Traffic` from their
counters and call the same `predict()` for the bound they print beside a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hypura.plan import knobs
from hypura.plan.units import ModelUnits

GPU, RAM, DISK = "gpu", "ram", "disk"
CPU = "cpu"  # a compute location (with GPU)
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

    def disk_seconds(self, nbytes: float, expert_bytes: float = 0.0) -> float:
        """Seconds to read nbytes from disk, of which expert_bytes are experts read where routers send
        decode (random reads, slower than the sequential requests of the rest)."""
        return _div(nbytes - expert_bytes, self.disk_read) + _div(expert_bytes, self.expert_disk_read or self.disk_read)

    def link_beside(self, cpu_bytes: float) -> float | None:
        """The link's rate when the CPU decodes `cpu_bytes` a token at the same time (both read RAM)."""
        return self.link * knobs.LINK_BESIDE_CPU if self.link and cpu_bytes > 0 and not self.unified else self.link

    @property
    def has_gpu(self) -> bool:
        return self.gpu_read is not None

    @property
    def can_stream_to_gpu(self) -> bool:
        return self.has_gpu and (self.unified or bool(self.link))


@dataclass(frozen=True)
class Traffic:
    """Bytes per decode token on each path, and per prefill micro-batch of n_ubatch tokens."""

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


@dataclass(frozen=True)
class Prediction:
    decode_tok_s: float
    decode_limit: str  # which path bounds a token: gpu | cpu | link | disk
    prefill_tok_s: float
    prefill_limit: str  # compute | link | disk
    seconds: dict = field(default_factory=dict)  # per decode token, per path (+ "overhead")
    bytes_per_token: dict = field(default_factory=dict)

    def gbps(self) -> dict:
        """Each path's rate at the predicted tok/s, GB/s: the headline a streaming engine prints."""
        return {k: v * self.decode_tok_s / 1e9 for k, v in self.bytes_per_token.items()}


def _div(num: float, rate: float | None) -> float:
    if num <= 0:
        return 0.0
    return num / rate if rate else float("inf")


def predict(t: Traffic, r: Rates) -> Prediction:
    gpu_s, cpu_s = _div(t.gpu_bytes, r.gpu_read), _div(t.cpu_bytes, r.cpu_read)
    gpu_fixed, cpu_fixed = t.gpu_layers * r.gpu_layer_s, t.cpu_layers * r.cpu_layer_s
    streaming = t.link_bytes > 0 or t.disk_bytes > 0
    overhead = gpu_fixed + cpu_fixed + t.splits * (r.stream_split_s if streaming else r.split_s)
    paths = {"compute": gpu_s + cpu_s + overhead, "link": _div(t.link_bytes, r.link_beside(t.cpu_bytes)),
             "disk": r.disk_seconds(t.disk_bytes, t.expert_disk_bytes)}
    limit = max(paths, key=paths.get)
    if limit == "compute":
        limit = GPU if gpu_s + gpu_fixed >= cpu_s + cpu_fixed else CPU
    token_s = max(paths.values())

    if t.prefill_on_gpu:
        pre_compute = _div(t.prefill_flops - t.prefill_cpu_flops, r.gpu_flops) + _div(t.prefill_cpu_flops, r.cpu_flops)
    else:
        pre_compute = _div(t.prefill_flops, r.cpu_flops)
    pre = {"compute": pre_compute, "link": _div(t.prefill_link_bytes, r.link),
           "disk": _div(t.prefill_disk_bytes, r.disk_read)}
    pre_limit = max(pre, key=pre.get)
    batch_s = max(pre.values())
    return Prediction(
        decode_tok_s=1.0 / token_s if token_s > 0 else float("inf"),
        decode_limit=limit,
        prefill_tok_s=t.n_ubatch / batch_s if batch_s > 0 else float("inf"),
        prefill_limit=pre_limit,
        seconds={"gpu": gpu_s, "cpu": cpu_s, "link": paths["link"], "disk": paths["disk"], "overhead": overhead},
        bytes_per_token={"gpu": t.gpu_bytes, "cpu": t.cpu_bytes, "link": t.link_bytes, "disk": t.disk_bytes},
    )


def traffic(mu: ModelUnits, tiers: Sequence[str], compute: Sequence[str], kv_tier: str, kv_bytes: int,
            rates: Rates, n_ubatch: int = knobs.N_UBATCH) -> Traffic:
    """Bytes per path of a placement: `tiers[i]` (gpu|ram|disk) and `compute[i]` (gpu|cpu) of
    unit i; a dense unit is read every token, an expert with its probability p."""
    acc = dict.fromkeys(PATHS, 0.0)
    pre_link = pre_disk = flops = expert_disk = 0.0
    cpu_flops = cpu_link = 0.0  # what op offload would move to the GPU in a batch: CPU units' flops and bytes
    layer_devs: dict[tuple[int, int], set[str]] = {}
    for u, tier, dev in zip(mu.units, tiers, compute):
        a = u.p * u.nbytes
        acc[dev] += a
        if tier == DISK:
            acc["disk"] += a
            expert_disk += a if u.expert >= 0 else 0.0
        if dev == GPU and (tier == RAM or (tier == DISK and not rates.unified)):
            acc["link"] += a
        if u.host_only:
            continue  # get_rows of one embedding row: no matmul, no batch copy
        unit_flops = 2.0 * n_ubatch * u.elements * u.p
        flops += unit_flops
        touched = u.nbytes * (1.0 - (1.0 - u.p) ** n_ubatch)  # an expert: used by any token
        if tier == DISK:
            pre_disk += touched
        if tier == RAM or (tier == DISK and not rates.unified):
            pre_link += touched  # only counted when the GPU computes the batch (below)
            if dev == CPU:
                cpu_flops, cpu_link = cpu_flops + unit_flops, cpu_link + touched
        part = 0 if u.role in ("attn", "norm", "other") else 1
        layer_devs.setdefault((u.stage, part), set()).add(dev)
    acc[kv_tier if kv_tier == GPU else CPU] += knobs.KV_READ_FILL * kv_bytes
    # attention runs where the KV cache is, between the projections (q, k, v before; output after)
    kv_dev = kv_tier if kv_tier == GPU else CPU
    for (stage, part), devs in list(layer_devs.items()):
        if part == 0:
            layer_devs[(stage, 0.25)], layer_devs[(stage, 0.5)] = {kv_dev}, set(devs)

    sequence = [d for key in sorted(layer_devs) for d in sorted(layer_devs[key])]
    splits = sum(a != b for a, b in zip(sequence, sequence[1:]))
    on_gpu = rates.has_gpu and GPU in compute
    # the runtime turns op offload off beside CPU weights that hooks fill mid-graph (disk-tier ones): then
    # the CPU computes every CPU unit of a batch too, and none of their bytes cross the link
    offload_off = on_gpu and any(tier == DISK and dev == CPU for tier, dev in zip(tiers, compute))
    if offload_off:
        pre_link -= cpu_link
    layers = {GPU: set(), CPU: set()}
    for (layer, _), devs in layer_devs.items():
        for d in devs:
            layers[d].add(layer)
    return Traffic(
        gpu_bytes=acc[GPU], cpu_bytes=acc[CPU], link_bytes=acc["link"], disk_bytes=acc["disk"],
        expert_disk_bytes=expert_disk,
        gpu_layers=len(layers[GPU]), cpu_layers=len(layers[CPU]), splits=splits,
        n_ubatch=n_ubatch, prefill_flops=flops, prefill_link_bytes=pre_link if on_gpu else 0.0,
        prefill_disk_bytes=pre_disk, prefill_on_gpu=on_gpu,
        prefill_cpu_flops=cpu_flops if offload_off else 0.0,
    )
