"""What pinning host memory costs on this machine, for a model's load: the ways pinned weights can be had and
the host-to-GPU rate each gives. One question, one run; figures go to bench/RESULTS.md loads-gpu.

    python3 bench/pin_probe.py MODEL.gguf [--gib 8] [--json out.json]

Rows (each over the first --gib GiB of MODEL, which should be in the page cache; the probe reads it first):
  alloc      cudaHostAlloc of the size (what llama.cpp's pinned host buffers and Hypura's pinned copies cost)
  fill-1     one thread reading the file into that pinned memory (llama.cpp's load mode none)
  fill-N     N threads reading disjoint spans into it
  register   cudaHostRegister(read-only) of a read-only mapping of the file: the page cache's own pages pinned,
             no copy (what a mapped load could pin)
  h2d-*      cudaMemcpy to the GPU from the pinned allocation, the registered mapping, and pageable memory
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor

GIB = 1 << 30
CHUNK = 64 << 20


def cudart() -> ctypes.CDLL:
    names = ["libcudart.so", "libcudart.so.12", "libcudart.so.13", ctypes.util.find_library("cudart") or ""]
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    try:  # torch's wheel carries one
        import nvidia.cuda_runtime as rt  # type: ignore
        lib = os.path.join(list(rt.__path__)[0], "lib")
        return ctypes.CDLL(os.path.join(lib, next(f for f in os.listdir(lib) if f.startswith("libcudart.so"))))
    except Exception as exc:  # noqa: BLE001
        raise SystemExit(f"pin_probe: no CUDA runtime library found ({exc})")


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args()
    rt = cudart()
    size = min(int(a.gib * GIB), os.path.getsize(a.model)) // CHUNK * CHUNK
    rows: dict[str, dict] = {}

    def row(name: str, seconds: float, nbytes: int = size) -> None:
        rows[name] = {"s": round(seconds, 3), "GB/s": round(nbytes / seconds / 1e9, 2)}
        print(f"{name:14s} {seconds:7.3f} s  {nbytes / seconds / 1e9:7.2f} GB/s", flush=True)

    def check(err: int, what: str) -> None:
        if err != 0:
            raise SystemExit(f"pin_probe: {what} failed: cuda error {err}")

    with open(a.model, "rb") as f:  # into the page cache, as a second run finds it
        while f.read(CHUNK):
            pass
    check(rt.cudaFree(None), "cudaFree(0)")  # the context, outside the timings
    dev = ctypes.c_void_p()
    check(rt.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(size)), "cudaMalloc")

    host = ctypes.c_void_p()
    row("alloc", timed(lambda: check(rt.cudaHostAlloc(ctypes.byref(host), ctypes.c_size_t(size), 0), "cudaHostAlloc")))
    view = (ctypes.c_char * size).from_address(host.value)
    fd = os.open(a.model, os.O_RDONLY)

    def fill_span(start: int, end: int) -> None:
        mv = memoryview(view).cast("B")
        pos = start
        while pos < end:
            n = os.preadv(fd, [mv[pos:min(end, pos + CHUNK)]], pos)
            if n <= 0:
                raise SystemExit("pin_probe: short read")
            pos += n

    row("fill-1", timed(lambda: fill_span(0, size)))
    spans = [(i * size // a.threads // CHUNK * CHUNK, (i + 1) * size // a.threads // CHUNK * CHUNK)
             for i in range(a.threads)]
    spans[-1] = (spans[-1][0], size)
    with ThreadPoolExecutor(a.threads) as pool:
        row(f"fill-{a.threads}", timed(lambda: list(pool.map(lambda s: fill_span(*s), spans))))

    def h2d(src: int) -> None:
        check(rt.cudaMemcpy(dev, ctypes.c_void_p(src), ctypes.c_size_t(size), 1), "cudaMemcpy")
        check(rt.cudaDeviceSynchronize(), "sync")

    h2d(host.value)
    row("h2d-pinned", timed(lambda: h2d(host.value)))
    check(rt.cudaFreeHost(host), "cudaFreeHost")

    base = _mapping_address(a.model, size)
    flags = 0x01 | 0x08  # cudaHostRegisterPortable | cudaHostRegisterReadOnly
    err = ctypes.c_int(0)

    def register() -> None:
        err.value = rt.cudaHostRegister(ctypes.c_void_p(base), ctypes.c_size_t(size), flags)

    row("register", timed(register))
    if err.value == 0:
        h2d(base)
        row("h2d-registered", timed(lambda: h2d(base)))
        t = timed(lambda: check(rt.cudaHostUnregister(ctypes.c_void_p(base)), "cudaHostUnregister"))
        row("unregister", t)
    else:
        rows["register"]["error"] = err.value
        print(f"register failed: cuda error {err.value}")
    h2d(base)  # pageable: the mapping unregistered
    row("h2d-pageable", timed(lambda: h2d(base)))
    os.close(fd)
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"model": a.model, "bytes": size, "rows": rows}, out, indent=1)


def _mapping_address(path: str, size: int) -> int:
    """Map `path` read-only with libc's mmap (the address Python's mmap object hides) and return it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise SystemExit(f"pin_probe: mmap failed: errno {ctypes.get_errno()}")
    return addr


if __name__ == "__main__":
    main()
