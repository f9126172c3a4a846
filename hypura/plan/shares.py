"""Devices as tiers: a model's layers split over several devices (local GPUs, llama.cpp RPC servers) and the host,
as llama.cpp's layer split (`-sm layer`) runs them, with what fits nowhere streamed from disk.

llama.cpp keeps the first layers on the host (CPU) and gives the last `n_gpu_layers` of the n_layer + 1 "layers"
(the blocks, then the output head) to its devices in order, each a contiguous run whose length follows
`tensor_split`: integer counts as the split give exactly those counts (llama-model.cpp: the split points are
the counts' running sums over their total, compared with (layer - first) / n_gpu_layers in the same float math).
A layer's KV cache lives on its layer's device. The chain of a token is host -> device 1 -> ... -> device k ->
host (the logits), and each hand-off moves one activation (n_embd floats; the logits at the end) over a link:

    step = host layers' time + sum over devices (layer bytes read / device read rate + per-layer cost)
           + sum over hand-offs (link round trip + bytes / link rate)

Layers compute one after another (layer L+1 needs layer L), so the devices' times add; the search is exact for
this sum: a dynamic program over (device, layers so far) in chain order, every device free to take none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hypura.errors import HypuraError
from hypura.plan import knobs
from hypura.plan.budget import fmt_size
from hypura.units import ModelUnits

HOST = "host"
# f32 activations cross the links (ggml's graph splits copy the hidden state as it is computed)
ACT_BYTES = 4
# a local GPU's hand-off: one activation copy each way through the driver, 0.11 ms idle for 64 KiB pinned on the
# H200 (docs/design.md, "Facts"), less the bytes' own time
LOCAL_HOP_S = 0.1e-3


@dataclass(frozen=True)
class DeviceTier:
    """A device a plan may place layers on, with what the planner needs of it."""

    name: str  # llama.cpp's device name (CUDA1, RPC0): what --device and the plan's devices list say
    kind: str  # gpu | rpc
    budget: int  # bytes the plan may hold there (its free memory less the margin, or as given)
    read_bw: float  # weight bytes/s decode reads on it
    link_bw: float  # bytes/s to and from the host (PCIe for a GPU; the network for an RPC server)
    latency_s: float  # one hand-off's fixed cost over that link
    peer: tuple[tuple[str, float], ...] = ()  # (device, bytes/s) of direct peer copies, local GPUs
    layer_s: float = knobs.GPU_LAYER_S  # fixed cost a layer (an RPC server's CPU: knobs.CPU_LAYER_S)
    method: str = ""

    def hop_s(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.link_bw

    def peer_bw(self, other: str) -> float | None:
        return dict(self.peer).get(other)


@dataclass(frozen=True)
class HostTier:
    """The local process: RAM for the first layers, the CPU computing them, the disk for what fits nowhere."""

    ram: int
    cpu_read: float
    disk_read: float
    disk: bool = True


@dataclass(frozen=True)
class DeviceShares:
    """Where each of the n_layer + 1 layers (blocks, then the output head) goes, and the step's prediction."""

    model: str
    n_layer: int
    n_ctx: int
    devices: tuple[DeviceTier, ...]  # the chain, in llama.cpp's device order
    layers: tuple[int, ...]  # layers each device holds (its share), chain order
    host_layers: int  # the first layers, on the host
    host_disk_bytes: int  # of those, weights streamed from disk (RAM full)
    memory: tuple[tuple[str, int, int], ...]  # (device or host, bytes held, budget)
    seconds: tuple[tuple[str, float], ...]  # (part, seconds a token): host, each device, hand-offs
    notes: tuple[str, ...] = field(default=())

    @property
    def step_s(self) -> float:
        return sum(s for _, s in self.seconds)

    @property
    def tok_s(self) -> float:
        return 1.0 / self.step_s if self.step_s > 0 else float("inf")

    @property
    def limit(self) -> str:
        return max(self.seconds, key=lambda p: p[1])[0]

    @property
    def n_gpu_layers(self) -> int:
        return sum(self.layers)

    @property
    def used(self) -> tuple[DeviceTier, ...]:
        return tuple(d for d, n in zip(self.devices, self.layers) if n)

    def tensor_split(self) -> tuple[float, ...]:
        """llama.cpp's tensor_split for the devices list `device_names()`: the shares as counts."""
        return tuple(float(n) for n in self.layers if n)

    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.used)

    def flags(self) -> str:
        """The llama-completion flags that load this split (the RPC servers' own --rpc besides)."""
        if not self.used:
            return "-ngl 0"
        return (f"-dev {','.join(self.device_names())} -sm layer -ngl {self.n_gpu_layers} "
                f"-ts {','.join(str(n) for n in self.layers if n)}")


def _layer_rows(mu: ModelUnits, n_ctx: int) -> tuple[list[int], list[float], list[int]]:
    """Per layer of the n_layer + 1 (blocks, output head): bytes held, bytes a token reads, KV bytes held."""
    n = mu.dims.n_layer
    held, read, kv = [0] * (n + 1), [0.0] * (n + 1), [0] * (n + 1)
    for u in mu.units:
        stage = u.stage
        if stage < 0:
            if u.role != "output":  # the input embeddings stay on the host; a tied output is copied to the head
                continue
            stage = n
        held[stage] += u.nbytes
        read[stage] += u.nbytes * u.p
    per_layer_kv = mu.dims.kv_bytes_per_layer(n_ctx)
    for i in range(n):
        kv[i] = per_layer_kv
    return held, read, kv


def plan_shares(mu: ModelUnits, devices: Sequence[DeviceTier], host: HostTier, *, n_ctx: int,
                n_ubatch: int = knobs.N_UBATCH, model: str = "") -> DeviceShares:
    """The fastest split of the model over `devices` (in chain order) and the host; HypuraError when the model
    fits nowhere (disk off and devices + RAM too small)."""
    n = mu.dims.n_layer
    held, read, kv = _layer_rows(mu, n_ctx)
    N = n + 1
    pre_held, pre_read = [0], [0.0]
    for h, r, k in zip(held, read, kv):
        pre_held.append(pre_held[-1] + h + k)
        pre_read.append(pre_read[-1] + r)
    buf = mu.dims.compute_buffer_bytes(n_ubatch)
    embd = sum(u.nbytes for u in mu.units if u.stage < 0)  # the input layer, on the host (a tied head: copied too)
    act, logits = mu.dims.n_embd * ACT_BYTES, max(mu.dims.n_vocab, 1) * ACT_BYTES

    # the host takes the first i layers: resident up to its RAM, the rest read from disk each token
    host_room = host.ram - knobs.PROCESS_RAM - buf - embd

    def host_cost(i: int) -> tuple[float, int] | None:
        nbytes = pre_held[i]
        disk = max(0, nbytes - max(host_room, 0))
        if (disk and not host.disk) or host_room < 0:
            return None
        cpu = pre_read[i] / host.cpu_read + i * knobs.CPU_LAYER_S
        return max(cpu, disk / host.disk_read if disk else 0.0), disk

    def dev_cost(d: DeviceTier, i: int, j: int) -> float | None:
        if pre_held[j] - pre_held[i] + buf > d.budget:
            return None
        out = logits if j == N else act  # the head's device hands the logits back
        return (pre_read[j] - pre_read[i]) / d.read_bw + (j - i) * d.layer_s + d.hop_s(act) + d.hop_s(out)

    INF = float("inf")
    best = [INF] * (N + 1)
    cuts: list[list[int]] = [[] for _ in range(N + 1)]
    for i in range(N + 1):
        c = host_cost(i)
        if c is not None:
            best[i], cuts[i] = c[0], [i]
    for d in devices:
        nxt, nxt_cuts = list(best), [c + [c[-1] if c else 0] for c in cuts]  # this device takes none
        for j in range(1, N + 1):
            for i in range(j):
                if best[i] == INF:
                    continue
                c = dev_cost(d, i, j)
                if c is not None and best[i] + c < nxt[j]:
                    nxt[j], nxt_cuts[j] = best[i] + c, cuts[i] + [j]
        best, cuts = nxt, nxt_cuts
    if best[N] == INF:
        total = pre_held[N] + embd
        room = sum(max(0, d.budget - buf) for d in devices) + max(host_room, 0)
        raise HypuraError(f"{model or 'the model'} does not fit: {fmt_size(total)} with its KV cache at -c {n_ctx}, "
                          f"the devices and RAM hold {fmt_size(room)}" + ("" if host.disk else " (disk off)"))
    bounds = cuts[N]
    host_layers = bounds[0]
    layers = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    return _shares(model, n, n_ctx, tuple(devices), layers, host_layers, host_cost(host_layers), pre_held, pre_read,
                   buf, embd, act, logits, host)


def _shares(model, n, n_ctx, devices, layers, host_layers, host_c, pre_held, pre_read, buf, embd, act, logits,
            host) -> DeviceShares:
    """The split's memory and its step time, part by part (peer links where consecutive GPUs have one)."""
    N = n + 1
    host_s, host_disk = host_c
    memory = [(HOST, pre_held[host_layers] - host_disk + embd + buf + knobs.PROCESS_RAM, host.ram)]
    seconds = [(HOST, host_s)]
    at, prev, hops = host_layers, None, 0.0
    for d, k in zip(devices, layers):
        if not k:
            continue
        memory.append((d.name, pre_held[at + k] - pre_held[at] + buf, d.budget))
        seconds.append((d.name, (pre_read[at + k] - pre_read[at]) / d.read_bw + k * d.layer_s))
        peer = prev.peer_bw(d.name) if prev is not None else None
        if peer:
            hops += act / peer
        else:
            hops += (prev.hop_s(act) if prev is not None else 0.0) + d.hop_s(act)
        at, prev = at + k, d
    if prev is not None:
        hops += prev.hop_s(logits if at == N else act)
    seconds.append(("hand-offs", hops))
    notes = []
    if host_disk:
        notes.append(f"{fmt_size(host_disk)} of the host's layers stream from disk")
    return DeviceShares(model, n, n_ctx, devices, layers, host_layers, host_disk, tuple(memory), tuple(seconds),
                        tuple(notes))


def device_tiers(profile, rpc=(), gpu_mem: Sequence[int] | None = None, rpc_mem: Sequence[int] | None = None,
                 remote_read_bw: float | None = None) -> tuple[DeviceTier, ...]:
    """The chain llama.cpp builds by default: RPC servers' devices first (its order, "to minimize network
    transfers"), then the local GPUs. Budgets: free memory less knobs.GPU_MARGIN unless given (gpu_mem per local
    GPU, rpc_mem per RPC device). An RPC device decodes at `remote_read_bw`, else at the rate of the Q4_K
    matrix-vector product it computed when measured (hypura.profile.rpc)."""
    def budget(given: Sequence[int] | None, i: int, free: int) -> int:
        if given is not None and i < len(given):
            return int(given[i])
        return max(0, free - knobs.GPU_MARGIN)

    out = []
    for i, r in enumerate(rpc):
        out.append(DeviceTier(
            r.name, "rpc", budget(rpc_mem, i, r.mem_free), remote_read_bw or r.decode_bw, r.link_bw, r.latency_s,
            layer_s=knobs.CPU_LAYER_S, method=f"{r.endpoint}: {r.method}" + ("; decode rate given" if remote_read_bw
                                                                               else "")))
    names = {g.index: g.name for g in profile.gpus}
    for i, g in enumerate(profile.gpus):
        link = (g.h2d_pinned_bw or g.h2d_pageable_bw or knobs.PAGEABLE_LINK_DEFAULT)
        out.append(DeviceTier(
            g.name, "gpu", budget(gpu_mem, i, g.mem_free), g.decode_bw, link, LOCAL_HOP_S,
            peer=tuple((names[j], bw) for j, bw in g.peer_bw if j in names), method=g.method))
    return tuple(out)


def describe_shares(shares: DeviceShares) -> list[str]:
    """`hypura inspect`'s device table: each device's share, memory and seconds a token, then the bound."""
    held = {name: (h, b) for name, h, b in shares.memory}
    secs = dict(shares.seconds)
    rows = [f"{'device':<10} {'kind':<5} {'layers':>6} {'holds':>10} {'budget':>10} {'read GB/s':>9} "
            f"{'link GB/s':>9} {'ms/token':>8}"]
    h, b = held[HOST]
    rows.append(f"{HOST:<10} {'cpu':<5} {shares.host_layers:>6} {fmt_size(h):>10} {fmt_size(b):>10} "
                f"{'':>9} {'':>9} {secs[HOST] * 1e3:>8.2f}")
    for d, n in zip(shares.devices, shares.layers):
        h, b = held.get(d.name, (0, d.budget))
        rows.append(f"{d.name:<10} {d.kind:<5} {n:>6} {fmt_size(h):>10} {fmt_size(b):>10} {d.read_bw / 1e9:>9.1f} "
                    f"{d.link_bw / 1e9:>9.2f} {secs.get(d.name, 0.0) * 1e3:>8.2f}")
    rows.append(f"hand-offs over the links: {secs['hand-offs'] * 1e3:.2f} ms a token")
    rows.append(f"bound    {shares.tok_s:.2f} tok/s decode (limit: {shares.limit}); llama.cpp flags: {shares.flags()}")
    return rows + [f"note     {n}" for n in shares.notes]
