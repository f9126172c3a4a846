"""Machine profile: what `hypura profile` measures (host, GPUs, storage, CPU compute) and caches."""

from hypura.profile.model import CpuCompute, DiskInfo, GpuInfo, HostInfo, MachineProfile, load_profile
from hypura.profile.store import example_names, load_cached, machine_profile, quick_profile, resolve_profile

__all__ = ["CpuCompute", "DiskInfo", "GpuInfo", "HostInfo", "MachineProfile", "example_names", "load_cached",
           "load_profile", "machine_profile", "quick_profile", "resolve_profile"]
