"""Do host->GPU copies slow llama.cpp's CPU decode? Both read host RAM: if they share its bandwidth,
a byte streamed over PCIe costs the CPU time and the hybrid bound (CPU rate + link rate) is not
reachable. Measures llama-bench CPU-only decode alone and with pinned copies looping in a thread,
and the copies alone and beside the decode.

    python bench/ram_contention.py LLAMA_BENCH MODEL OUT.json   (threads: 16, as the other runs)
"""

import json
import subprocess
import sys
import threading
import time

import hypura  # noqa: F401  (our library before numpy)
import gguf
from hypura.bindings.ffi import ffi, lib
from hypura.profile.devices import first_gpu

COPY_BYTES = 1 << 30


def copy_loop(stop: threading.Event, out: dict) -> None:
    L, dev = lib(), first_gpu()
    params = ffi.new("struct ggml_init_params *", {"mem_size": 2 * L.ggml_tensor_overhead(), "mem_buffer": ffi.NULL,
                                                   "no_alloc": True})
    ctx = L.ggml_init(params[0])
    t = L.ggml_new_tensor_1d(ctx, int(gguf.GGMLQuantizationType.I8), COPY_BYTES)
    dev_buf = L.ggml_backend_alloc_ctx_tensors_from_buft(ctx, L.ggml_backend_dev_buffer_type(dev))
    host = L.ggml_backend_buft_alloc_buffer(L.ggml_backend_dev_host_buffer_type(dev), COPY_BYTES)
    base = L.ggml_backend_buffer_get_base(host)
    ffi.memset(base, 1, COPY_BYTES)
    moved, t0 = 0, time.perf_counter()
    while not stop.is_set():
        L.ggml_backend_tensor_set(t, base, 0, COPY_BYTES)
        moved += COPY_BYTES
    out["copy_gbps"] = moved / (time.perf_counter() - t0) / 1e9
    L.ggml_backend_buffer_free(host)
    L.ggml_backend_buffer_free(dev_buf)
    L.ggml_free(ctx)


def with_copies(fn, seconds=None) -> dict:
    stop, out = threading.Event(), {}
    th = threading.Thread(target=copy_loop, args=(stop, out))
    th.start()
    try:
        if fn:
            out.update(fn())
        else:
            time.sleep(seconds)
    finally:
        stop.set()
        th.join()
    return out


def cpu_decode(llama_bench: str, model: str) -> dict:
    r = subprocess.run([llama_bench, "-m", model, "-ngl", "0", "-t", "16", "-p", "0", "-n", "8", "-r", "2",
                        "-o", "json"], capture_output=True, text=True, check=True)
    row = json.loads(r.stdout)[0]
    return {"tok_s": row["avg_ts"], "tok_s_runs": row["samples_ts"]}


if __name__ == "__main__":
    llama_bench, model, out_path = sys.argv[1:4]
    result = {"copies_alone": with_copies(None, seconds=5), "decode_alone": cpu_decode(llama_bench, model)}
    result["decode_with_copies"] = with_copies(lambda: cpu_decode(llama_bench, model))
    print(json.dumps(result, indent=1))
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
