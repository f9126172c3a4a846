"""Which ggml devices a model loads onto: llama.cpp's --rpc, --device, --split-mode, --tensor-split and --main-gpu
as given, or, with RPC servers and no placement given, Hypura's split over them (hypura.plan.shares).

Without any of these the model's devices are llama.cpp's default and nothing here runs (the one-GPU path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional, Union

from hypura.errors import DeviceError
from hypura.plan import knobs
from hypura.plan.auto import MIN_CTX
from hypura.plan.shares import DeviceShares, Host, device_tiers, plan_shares
from hypura.sizes import parse_size
from hypura.units import model_units


@dataclass(frozen=True)
class DeviceAsk:
    """What the caller gave: RPC servers (llama-cpp-python's `rpc_servers`, "host:port,..."), llama.cpp's
    `--device` names ("none": nothing offloaded), Hypura's per-RPC-device budgets, and `split`: plan the split
    over this machine's GPUs too where no RPC server is given (several GPUs; without it they load as one)."""

    rpc_servers: Union[str, Sequence[str], None] = None
    devices: Optional[Sequence[str]] = None
    rpc_mem: Optional[Sequence[Union[int, str]]] = None
    split: bool = False

    @property
    def given(self) -> bool:
        return bool(self.rpc_servers) or self.devices is not None or self.split


@dataclass(frozen=True)
class DeviceChoice:
    devices: Optional[tuple[str, ...]] = None  # llama_model_params.devices; None: llama.cpp's default list
    shares: Optional[DeviceShares] = None  # Hypura's split, where it made one
    line: str = ""

    def array(self):
        """The devices as llama_model_params.devices takes them (keep it alive while the params are)."""
        return device_array(self.devices)


def choose(header, ask: DeviceAsk, k: dict, overrides: dict, *, placed: bool, ram: Optional[int], profile: Callable,
           gpu_mem=None, say: Optional[Callable[[str], None]] = None,
           warn: Optional[Callable[[str], None]] = None) -> DeviceChoice:
    """Register the RPC servers (each probed first: a dead one is one error line, never an abort), then the
    devices list; with RPC servers, every layer offered (n_gpu_layers -1), no split or device list given,
    llama.cpp's layer split and no other placement (`placed`), the split is planned: `k` (llama_cpp.Llama's
    keywords) and `overrides` (hypura.Llama's param_overrides, which win over them) get its n_gpu_layers,
    tensor_split and n_ctx. gpu_mem: a budget for each local GPU (one size: each), ram the host's. say: where the
    split's line goes (None: nowhere); warn: where a remote server's line goes (None: stderr), always said."""
    if not ask.given:
        return DeviceChoice()
    from hypura.profile.rpc import add_servers

    rpc = (add_servers(ask.rpc_servers, warn) if warn else add_servers(ask.rpc_servers)) if ask.rpc_servers else ()
    if ask.devices is not None:
        choice = DeviceChoice(tuple(ask.devices))
        choice.array()  # an unknown device is refused now, before anything loads
        return choice
    import llama_cpp

    model, context = overrides.setdefault("model_params", {}), overrides.setdefault("context_params", {})
    if (not (rpc or ask.split) or placed or model.get("n_gpu_layers", k["n_gpu_layers"]) != -1
            or k["tensor_split"] is not None or model.get("split_mode", k["split_mode"]) != llama_cpp.LLAMA_SPLIT_MODE_LAYER):
        return DeviceChoice()
    k["n_ctx"] = context.get("n_ctx", k["n_ctx"])
    shares = plan_devices(header, rpc, ask.rpc_mem, k, ram, profile(), gpu_mem)
    k.update(n_gpu_layers=shares.n_gpu_layers, tensor_split=list(shares.tensor_split()) or None, n_ctx=shares.n_ctx)
    model["n_gpu_layers"], context["n_ctx"] = shares.n_gpu_layers, shares.n_ctx
    line = f"hypura: devices: {describe(shares)}"
    if say is not None:
        say(line)
    return DeviceChoice(shares.device_names() or ("none",), shares, line)


def plan_devices(header, rpc_names: Sequence[str], rpc_mem, k: dict, ram: Optional[int], profile,
                 gpu_mem=None) -> DeviceShares:
    """Measure each RPC device (memory, link) and split the model over them, this machine's GPUs and its RAM."""
    from hypura.profile.free import free_memory
    from hypura.profile.rpc import measure_device

    from hypura.profile.devices import list_devices

    rpc = [measure_device(name) for name in rpc_names]
    free = {d.index: d.mem_free for d in list_devices() if d.is_gpu}  # now, not when the profile was measured
    profile = dataclasses.replace(profile, gpus=tuple(dataclasses.replace(g, mem_free=free.get(g.index, g.mem_free))
                                                      for g in profile.gpus))
    given = [parse_size(m) for m in rpc_mem] if rpc_mem else None
    ram_budget = parse_size(ram) if ram is not None else max(0, free_memory().ram - knobs.RAM_MARGIN)
    # disk off: streaming the host's layers beside devices is planned (inspect) but not loaded yet
    host = Host(ram_budget, profile.cpu.decode_bw, profile.disk.read_bw, disk=False)
    # an unset context: llama.cpp's --fit-ctx default, or the training context where that is smaller
    n_ctx = k["n_ctx"] or min(int(header.get("context_length", 0) or MIN_CTX), MIN_CTX)
    gpus = [parse_size(m) for m in str(gpu_mem).split(",")] if gpu_mem is not None else None
    if gpus is not None and len(gpus) == 1:
        gpus = gpus * len(profile.gpus)
    return plan_shares(model_units(header), device_tiers(profile, rpc, gpu_mem=gpus, rpc_mem=given), host, n_ctx=n_ctx,
                       n_ubatch=k["n_ubatch"], model=header.path.name)


def describe(shares: DeviceShares) -> str:
    """One line: each device's share, the host's, the bound and what limits it."""
    parts = [f"host {shares.host_layers}"] + [f"{d.name} {n}" for d, n in zip(shares.devices, shares.layers) if n]
    return (f"{' + '.join(parts)} of {shares.n_layer + 1} layers, -c {shares.n_ctx}; predicted "
            f"{shares.tok_s:.2f} tok/s (limit: {shares.limit})")


def device_array(names: Optional[Sequence[str]]):
    """llama_model_params.devices for `names` as common/arg.cpp's parse_device_list makes it: a NULL-terminated
    array of ggml devices; "none" alone: no device. None: llama.cpp's default (NULL)."""
    if names is None:
        return None
    from hypura.bindings.ffi import ffi, lib

    L = lib()
    if list(names) == ["none"]:
        return ffi.new("ggml_backend_dev_t[1]")
    if not names:
        raise DeviceError("no devices specified")
    out = ffi.new(f"ggml_backend_dev_t[{len(names) + 1}]")
    for i, name in enumerate(names):
        dev = L.ggml_backend_dev_by_name(name.encode())
        if dev == ffi.NULL or L.ggml_backend_dev_type(dev) == L.GGML_BACKEND_DEVICE_TYPE_CPU:
            there = offload_devices()
            raise DeviceError(f"invalid device: {name} ("
                              + (f"available: {', '.join(there)}" if there else "no device to offload to here")
                              + '; "none" offloads nothing)')
        out[i] = dev
    return out


def offload_devices() -> list[str]:
    """The names --device accepts besides "none", as llama.cpp's --list-devices shows them (the CPU is not one)."""
    from hypura.bindings.ffi import ffi, lib

    L = lib()
    devs = [L.ggml_backend_dev_get(i) for i in range(L.ggml_backend_dev_count())]
    return [ffi.string(L.ggml_backend_dev_name(d)).decode() for d in devs
            if L.ggml_backend_dev_type(d) != L.GGML_BACKEND_DEVICE_TYPE_CPU]
