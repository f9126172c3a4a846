"""The devices a load uses, as llama.cpp takes them: the RPC servers registered (each probed first), a `--device`
list checked, the RPC devices and local GPUs measured for the decision's split (hypura.plan.split), and the list
set in llama_model_params. Which devices hold what is the decision's (hypura.plan.decision): nothing is decided here.

Nothing asked (no RPC server, device list or split): llama.cpp's default devices, and nothing here runs (the
one-GPU path).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

from hypura.errors import DeviceError
from hypura.plan.ask import DeviceAsk
from hypura.plan.split import Devices


def register(ask: DeviceAsk, warn: Optional[Callable[[str], None]] = None) -> tuple[str, ...]:
    """Probe the servers an earlier load registered that this one may use, register the RPC servers given now (each
    probed first: a dead one is one error line, never an abort) and check the device list; the RPC devices' names.
    warn: where a remote server's line goes (None: stderr), always said."""
    from hypura.profile.rpc import add_servers, parse_servers, probe_registered

    # servers an earlier load registered stay llama.cpp's devices; those given now are probed as they are added
    probe_registered(ask.names, but=parse_servers(ask.rpc_servers) if ask.rpc_servers else ())
    if not ask.given:
        return ()
    rpc = (add_servers(ask.rpc_servers, warn) if warn else add_servers(ask.rpc_servers)) if ask.rpc_servers else ()
    if ask.names is not None:
        device_array(ask.names)  # an unknown device is refused now, before anything loads
    return rpc


def measure(rpc_names: Sequence[str]) -> Devices:
    """Each RPC device (memory, link) and this machine's GPUs' free memory now, not when the profile was measured
    (an RPC device is never among them: hypura.profile.devices.local_gpus)."""
    from hypura.profile.devices import local_gpus
    from hypura.profile.rpc import measure_device

    rpc = tuple(measure_device(name) for name in rpc_names)
    return Devices(rpc, {d.index: d.mem_free for d in local_gpus()})


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
