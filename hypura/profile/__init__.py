"""Machine profile: what `hypura profile` measures (host, GPUs, storage, CPU compute) and caches.

    machine.py        MachineProfile: frozen dataclasses with a JSON form, each section saying how it was measured
    store.py          where profiles live: the user cache keyed by the hardware, examples/, a quick unmeasured one
    measure.py        the measurement: host, accelerators, storage, CPU compute
    host.py           CPU, RAM and the memory copy rate
    devices.py        accelerators through ggml's device API, and their pinned, pageable and on-device rates
    rpc.py            llama.cpp RPC servers greeted (protocol checked) and registered as devices
    disk.py           a filesystem's sequential read rate with O_DIRECT
    compute.py        the CPU's decode rate on the model's own first blocks
    gpu_compute.py    the GPU's prompt rate on the same blocks
    model_slice.py    a model's first blocks as a GGUF of their own (what compute.py times)
    apart.py          measurements in a child process, so what they allocate never counts in the caller's RSS
    free.py           free GPU memory and available RAM now (cgroup-capped): what the default path plans within
    measure_knobs.py  every constant of the measurements, with why it has its value
    examples/         profiles of known machines, for planning for them elsewhere (`--profile NAME`)
"""

from hypura.profile.machine import CpuCompute, DiskInfo, GpuInfo, HostInfo, MachineProfile, load_profile
from hypura.profile.store import example_names, load_cached, machine_profile, quick_profile, resolve_profile

__all__ = ["CpuCompute", "DiskInfo", "GpuInfo", "HostInfo", "MachineProfile", "example_names", "load_cached",
           "load_profile", "machine_profile", "quick_profile", "resolve_profile"]
