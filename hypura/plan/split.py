"""The several-device part of the decision (decide() calls it; `hypura inspect --split/--rpc` prints it through
decide() too): with RPC servers or `split` asked, every layer offered (n_gpu_layers -1), llama.cpp's layer split,
and no device list, tensor_split or other placement given, the layers are split over the RPC devices, this
machine's GPUs and the host (shares.py), within a budget per device and the host's RAM.

What it needs of the machine is measured by the caller and passed in (`Devices`): the RPC devices' memory and
links, and each local GPU's free memory now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from hypura.plan.ask import Ask
from hypura.plan.budget import host_ram, per_gpu
from hypura.plan.shares import DeviceShares, HostTier, device_tiers, plan_shares
from hypura.units import model_units


@dataclass(frozen=True)
class Devices:
    """What the split plans over, measured by the caller: each RPC device (hypura.profile.rpc.RpcDevice), and each
    local GPU's free memory now by ggml index (None: the profile's)."""

    rpc: tuple = ()
    gpu_free: Optional[Mapping[int, int]] = None


def splits(ask: Ask) -> bool:
    """The decision plans the split: RPC servers or `split`, nothing placed otherwise (module docstring)."""
    d = ask.devices
    return ((bool(d.rpc_servers) or d.split) and d.names is None and not ask.placement and ask.plan is None
            and ask.expert_cache is None and ask.fit.enabled and ask.n_gpu_layers == -1 and not d.tensor_split
            and d.layer_split)


def plan_split(header, ask: Ask, devices: Devices, profile, free_ram: Optional[int]) -> DeviceShares:
    """The split of `header`'s layers over `devices`, the profile's GPUs and the host. free_ram: what this machine's
    RAM has free now (None: another machine's, the profile's); both less the margin, unless ask.ram is given."""
    if devices.gpu_free is not None:
        profile = dataclasses.replace(profile, gpus=tuple(
            dataclasses.replace(g, mem_free=devices.gpu_free.get(g.index, g.mem_free)) for g in profile.gpus))
    ram = host_ram(ask.ram, free_ram if free_ram is not None else profile.host.ram_available)
    host = HostTier(ram, profile.cpu.decode_bw, profile.disk.read_bw, ask.devices.disk)
    # an unset context: llama.cpp's --fit-ctx default, or the training context where that is smaller
    n_ctx = ask.n_ctx or min(int(header.get("context_length", 0) or ask.fit.min_ctx), ask.fit.min_ctx)
    tiers = device_tiers(profile, devices.rpc, gpu_mem=per_gpu(ask.gpu_mem, len(profile.gpus)),
                         rpc_mem=ask.devices.rpc_mem)
    return plan_shares(model_units(header), tiers, host, n_ctx=n_ctx, n_ubatch=ask.n_ubatch, model=header.path.name)


def describe(shares: DeviceShares) -> str:
    """One line: each device's share, the host's, the bound and what limits it."""
    parts = [f"host {shares.host_layers}"] + [f"{d.name} {n}" for d, n in zip(shares.devices, shares.layers) if n]
    return (f"{' + '.join(parts)} of {shares.n_layer + 1} layers, -c {shares.n_ctx}; predicted "
            f"{shares.tok_s:.2f} tok/s (limit: {shares.limit})")


__all__ = ["Devices", "describe", "plan_split", "splits"]
