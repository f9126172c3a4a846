"""The device flags of `hypura-cli`, as llama-completion reads them (common/arg.cpp): --rpc, -dev/--device,
-sm/--split-mode, -ts/--tensor-split, -mg/--main-gpu; and Hypura's --rpc-mem (a budget per RPC device)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from hypura.cli.completion.arg_values import stof, stoi, value_error
from hypura.errors import HypuraError
from hypura.sizes import parse_size

DEVICE_OPTIONS = [
    (("--rpc", "rpc"),
     dict(metavar="SERVERS", help="comma-separated list of RPC servers (host:port); docs/devices.md",
          envvar="LLAMA_ARG_RPC")),
    (("-dev", "--device", "device"),
     dict(metavar="<dev1,dev2,..>", help="comma-separated list of devices to use for offloading (none = don't "
                                         "offload)", envvar="LLAMA_ARG_DEVICE")),
    (("-sm", "--split-mode", "split_mode"),
     dict(metavar="{none,layer,row,tensor}", help="how to split the model across multiple GPUs (default: layer)",
          envvar="LLAMA_ARG_SPLIT_MODE")),
    (("-ts", "--tensor-split", "tensor_split"),
     dict(metavar="N0,N1,N2,...", help="fraction of the model to offload to each GPU, comma-separated list of "
                                       "proportions, e.g. 3,1", envvar="LLAMA_ARG_TENSOR_SPLIT")),
    (("-mg", "--main-gpu", "main_gpu"),
     dict(metavar="INDEX", help="the GPU to use for the model (with split-mode = none), or for intermediate "
                                "results and KV (with split-mode = row) (default: 0)", envvar="LLAMA_ARG_MAIN_GPU")),
    (("--split", "split"),
     dict(is_flag=True, default=False, help="Hypura: split the layers over this machine's GPUs (and the --rpc "
                                            "servers) and its RAM, as -sm layer runs them (docs/devices.md)")),
    (("--rpc-mem", "rpc_mem"),
     dict(metavar="SIZE,...", help="Hypura: memory budget of each RPC device, in order (default: what each server "
                                   "reports free, less 1 GiB)")),
]

# llama.h's enum llama_split_mode (flags parse before the library loads)
SPLIT_MODE_NONE, SPLIT_MODE_LAYER, SPLIT_MODE_ROW, SPLIT_MODE_TENSOR = 0, 1, 2, 3
_SPLIT_MODES = {"none": SPLIT_MODE_NONE, "layer": SPLIT_MODE_LAYER, "row": SPLIT_MODE_ROW, "tensor": SPLIT_MODE_TENSOR}
# llama_max_devices() of this llama.cpp (src/llama.cpp: 16)
MAX_DEVICES = 16


@dataclass(frozen=True)
class DeviceSettings:
    rpc: Optional[str] = None
    devices: Optional[tuple[str, ...]] = None
    split_mode: int = SPLIT_MODE_LAYER
    tensor_split: Optional[tuple[float, ...]] = None
    main_gpu: int = 0
    rpc_mem: Optional[tuple[int, ...]] = None
    split: bool = False

    @property
    def placement(self) -> bool:
        """Placement as given (llama.cpp's --fit yields to them): a device list, a split, another split mode."""
        return (self.devices is not None or self.tensor_split is not None
                or self.split_mode != SPLIT_MODE_LAYER)


def device_settings(kw: dict) -> DeviceSettings:
    """The flags above (popped from kw), with llama.cpp's rules and messages."""
    out: dict = {}
    rpc, device, mode = kw.pop("rpc"), kw.pop("device"), kw.pop("split_mode")
    split, main, mem = kw.pop("tensor_split"), kw.pop("main_gpu"), kw.pop("rpc_mem")
    if kw.pop("split"):
        out["split"] = True
    if rpc is not None:
        if not [s for s in rpc.split(",") if s]:
            raise value_error("--rpc", "no RPC servers specified")
        out["rpc"] = rpc
    if device is not None:
        names = tuple(n for n in device.split(",") if n)
        if not names:
            raise value_error("--device", "no devices specified")
        out["devices"] = names  # names are looked up once the RPC servers are registered (hypura.runtime.device_list)
    if mode is not None:
        if mode not in _SPLIT_MODES:
            raise value_error("--split-mode", "invalid value")
        out["split_mode"] = _SPLIT_MODES[mode]
    if split is not None:
        parts = re.split(r"[,/]+", split)
        if len(parts) >= MAX_DEVICES:
            raise value_error("--tensor-split", f"got {len(parts)} input configs, but system only has "
                                                f"{MAX_DEVICES} devices")
        try:
            out["tensor_split"] = tuple(stof(p) for p in parts)
        except ValueError as e:
            raise value_error("--tensor-split", str(e)) from None
    if main is not None:
        try:
            out["main_gpu"] = stoi(main)
        except ValueError as e:
            raise value_error("--main-gpu", str(e)) from None
    if mem is not None:
        try:
            out["rpc_mem"] = tuple(parse_size(m) for m in mem.split(","))
        except HypuraError as e:
            raise value_error("--rpc-mem", str(e)) from None
    return DeviceSettings(**out)
