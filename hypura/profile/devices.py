"""Accelerators through ggml's device API (our cffi bindings): what is there, and how fast bytes
reach it.

Three links per device, each timed over synchronous ggml calls (the CUDA backend synchronizes its
stream inside set_tensor and cpy_tensor):
  pinned   ggml_backend_tensor_set from a buffer of the device's host buffer type (cudaHostAlloc)
  pageable ggml_backend_tensor_set from ordinary memory (a numpy array)
  d2d      ggml_backend_tensor_copy between two tensors on the device; reported as bytes read +
           written per second, as CUDA's bandwidthTest does, so it compares with HBM figures
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import gguf
import numpy as np

from hypura.errors import HypuraError
from hypura.profile import measure_knobs as knobs

_GPU_TYPES = ("GPU", "IGPU")
_TYPE_NAMES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    description: str
    kind: str  # CPU | GPU | IGPU | ACCEL
    mem_free: int
    mem_total: int
    remote: bool = False  # a llama.cpp RPC server's device (it registers as a GPU): never "the GPU" of a plan

    @property
    def is_gpu(self) -> bool:
        return self.kind in _GPU_TYPES and not self.remote

    @property
    def unified(self) -> bool:
        # Apple's Metal device and integrated GPUs share host RAM
        return self.kind == "IGPU" or sys.platform == "darwin"


@dataclass(frozen=True)
class Links:
    h2d_pinned_bw: float | None  # None: the device has no host buffer type
    h2d_pageable_bw: float
    d2d_bw: float


def _lib():
    from hypura.bindings.ffi import ffi, lib

    return ffi, lib()


def list_devices(remote: bool = True) -> list[Device]:
    """Every ggml device (backends register statically: no llama_backend_init needed); remote False: RPC servers'
    devices left out unasked (their memory is a round trip to the server, and a dead server's aborts the process)."""
    ffi, L = _lib()
    out = []
    for i in range(L.ggml_backend_dev_count()):
        dev = L.ggml_backend_dev_get(i)
        if not remote and is_remote(dev):
            continue
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        L.ggml_backend_dev_memory(dev, free, total)
        out.append(Device(i, ffi.string(L.ggml_backend_dev_name(dev)).decode(),
                          ffi.string(L.ggml_backend_dev_description(dev)).decode(),
                          _TYPE_NAMES.get(int(L.ggml_backend_dev_type(dev)), "?"), free[0], total[0],
                          is_remote(dev)))
    return out


def local_gpus() -> list[Device]:
    """This machine's GPUs, in ggml's order (an RPC server's devices register as GPUs: never among them)."""
    return [d for d in list_devices(remote=False) if d.is_gpu]


def is_remote(dev) -> bool:
    """A device of llama.cpp's RPC backend (ggml-rpc registers each server's devices under a reg named "RPC[...]")."""
    ffi, L = _lib()
    return ffi.string(L.ggml_backend_reg_name(L.ggml_backend_dev_backend_reg(dev))).decode().startswith("RPC")


def first_gpu():
    """The ggml device of the first discrete GPU (what Tier.GPU places on), None without one."""
    return _first_device("GPU")


def cpu_device():
    """The ggml CPU device (its buffer type is plain host memory), None in a build without one."""
    return _first_device("CPU")


def _first_device(kind: str):
    ffi, L = _lib()
    want = getattr(L, f"GGML_BACKEND_DEVICE_TYPE_{kind}")
    for i in range(L.ggml_backend_dev_count()):
        dev = L.ggml_backend_dev_get(i)
        if L.ggml_backend_dev_type(dev) == want and not is_remote(dev):
            return dev
    return None


def has_gpu() -> bool:
    """A discrete GPU that llama.cpp can place tensors on (what Tier.GPU needs)."""
    return first_gpu() is not None


def _best_rate(fn, nbytes: int, repeats: int) -> float:
    fn()  # warm-up: first-touch, lazy allocation, driver setup
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def measure_links(device_index: int, nbytes: int = knobs.LINK_BYTES, repeats: int = knobs.LINK_REPEATS,
                  d2d_repeats: int = knobs.D2D_REPEATS) -> Links:
    """Time host->device copies (pinned, pageable) and a device copy on ggml device `device_index`.
    Runs on any device, the CPU included (where every link is a memcpy), so tests reach this path."""
    ffi, L = _lib()
    dev = L.ggml_backend_dev_get(device_index)
    params = ffi.new("struct ggml_init_params *", {"mem_size": 4 * L.ggml_tensor_overhead(),
                                                   "mem_buffer": ffi.NULL, "no_alloc": True})
    ctx = L.ggml_init(params[0])
    if ctx == ffi.NULL:
        raise HypuraError("ggml_init failed")
    buffers = []
    try:
        src = L.ggml_new_tensor_1d(ctx, int(gguf.GGMLQuantizationType.I8), nbytes)
        dst = L.ggml_new_tensor_1d(ctx, int(gguf.GGMLQuantizationType.I8), nbytes)
        dev_buf = L.ggml_backend_alloc_ctx_tensors_from_buft(ctx, L.ggml_backend_dev_buffer_type(dev))
        if dev_buf == ffi.NULL:
            raise HypuraError(f"cannot allocate 2 x {nbytes >> 20} MiB on device {device_index}")
        buffers.append(dev_buf)

        pageable = np.full(nbytes, 7, dtype=np.uint8)
        ptr = ffi.from_buffer(pageable)
        pageable_bw = _best_rate(lambda: L.ggml_backend_tensor_set(src, ptr, 0, nbytes), nbytes, repeats)

        pinned_bw = None
        host_buft = L.ggml_backend_dev_host_buffer_type(dev)
        if host_buft != ffi.NULL:
            host_buf = L.ggml_backend_buft_alloc_buffer(host_buft, nbytes)
            if host_buf != ffi.NULL:
                buffers.append(host_buf)
                base = L.ggml_backend_buffer_get_base(host_buf)
                ffi.memmove(base, ptr, nbytes)  # touch every page before timing
                pinned_bw = _best_rate(lambda: L.ggml_backend_tensor_set(src, base, 0, nbytes), nbytes, repeats)

        d2d_bw = 2 * _best_rate(lambda: L.ggml_backend_tensor_copy(src, dst), nbytes, d2d_repeats)
        return Links(pinned_bw, pageable_bw, d2d_bw)
    finally:
        for buf in buffers:
            L.ggml_backend_buffer_free(buf)
        L.ggml_free(ctx)


def measure_peer(src_index: int, dst_index: int, nbytes: int = knobs.PEER_BYTES,
                 repeats: int = knobs.LINK_REPEATS) -> float:
    """Bytes/s of ggml_backend_tensor_copy from a tensor on device `src_index` to one on `dst_index`: a peer copy
    where the backend has one (CUDA's cudaMemcpyPeer), else through host memory, which is what a layer split's
    hand-off between the two then costs."""
    ffi, L = _lib()
    params = ffi.new("struct ggml_init_params *", {"mem_size": 2 * L.ggml_tensor_overhead(),
                                                   "mem_buffer": ffi.NULL, "no_alloc": True})
    ctxs = [L.ggml_init(params[0]) for _ in range(2)]
    buffers = []
    try:
        if ffi.NULL in ctxs:
            raise HypuraError("ggml_init failed")
        tensors = []
        for ctx, index in zip(ctxs, (src_index, dst_index)):
            tensors.append(L.ggml_new_tensor_1d(ctx, int(gguf.GGMLQuantizationType.I8), nbytes))
            buf = L.ggml_backend_alloc_ctx_tensors_from_buft(ctx, L.ggml_backend_dev_buffer_type(
                L.ggml_backend_dev_get(index)))
            if buf == ffi.NULL:
                raise HypuraError(f"cannot allocate {nbytes >> 20} MiB on device {index}")
            buffers.append(buf)
        return _best_rate(lambda: L.ggml_backend_tensor_copy(tensors[0], tensors[1]), nbytes, repeats)
    finally:
        for buf in buffers:
            L.ggml_backend_buffer_free(buf)
        for ctx in ctxs:
            if ctx != ffi.NULL:
                L.ggml_free(ctx)
