"""How fast can a GPU kernel read selected experts straight out of pinned host memory (zero-copy, over PCIe),
beside the copy engine moving the same bytes and the kernel reading them from HBM? (CuPy, no Hypura.)

    python3 bench/zero_copy_rate.py OUT.json [HOST_GIB]     (default: 4 GiB pinned)

Why: issue #5's last unmet speed target is 1.5x llama.cpp for the Qwen3-30B-A3B shape at 4 GiB of GPU and 24 GiB
of RAM, where every expert fits in RAM. llama.cpp (`-ncmoe 41`) computes 41 layers' experts on the CPU at ~62 GB/s
effective (0.94 GB a token of 19.2 ms). A 4 GiB GPU holds ~15% of the experts, whether whole layers or a cache, so
the rest must be computed where it lies or moved, and per-layer host round trips (0.21 ms x 41 = 8.6 ms) leave no
room for a host-driven split. One route remains: every layer's experts split statically between the CPU and GPU
kernels that read their share from pinned host memory, no host decision in the loop. Its ceiling is
0.94 GB / (62 GB/s + this zero-copy rate) plus the GPU's own work (assumed 3.5 ms), if both sides keep their rates
at once; zero_copy_contention.py measures how much they keep.

A "token" here is 41 layers, each reading 8 random 2.86 MB experts (qwen3-30b-a3b Q4_K_M: gate and up Q4_K, down
Q6_K), a kernel launch a layer. Wall-clock per token, median of 8 after a warm-up, 5 repeats on other experts.
H200 (session 19): zero-copy 50.5 GB/s, copy engine 51.8 GB/s, from HBM 2.1 TB/s (launch-bound).
"""

import functools
import json
import random
import statistics
import sys
import time

try:
    import cupy as cp
except ImportError:
    sys.exit(f"{__file__}: needs CuPy, on a machine with a CUDA GPU")
import numpy as np

EXPERT_BYTES = 2_856_960  # 17.55 GB of experts / (48 layers x 128), rounded to 16 bytes
LAYERS, K, TOKENS, REPEATS = 41, 8, 8, 5

_READ = cp.RawKernel(r"""
extern "C" __global__ void read_experts(unsigned long long base, const long long* offsets, long long n16,
                                        unsigned long long* sink) {
    // blockIdx.y: which expert; the x blocks stride over its 16-byte words. XOR keeps the loads live
    const uint4* p = (const uint4*)(base + offsets[blockIdx.y]);
    unsigned int acc = 0;
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(p + i);  // streaming: read once, as a matmul reads weights
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) atomicAdd(sink, 1ull);
}
""", "read_experts")


def token_offsets(rng: random.Random, n_experts: int) -> list[tuple[np.ndarray, cp.ndarray]]:
    """A token's experts, layer by layer: byte offsets on the host and on the GPU, before the timing starts."""
    layers = [np.array(sorted(rng.sample(range(n_experts), K)), np.int64) * EXPERT_BYTES for _ in range(LAYERS)]
    return [(offsets, cp.asarray(offsets)) for offsets in layers]


def per_token(run_token, tokens: list) -> float:
    """Median seconds a token (one warm-up token first); run_token returns once its work is done."""
    run_token(tokens[0])
    seconds = []
    for token in tokens:
        t0 = time.perf_counter()
        run_token(token)
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


@functools.cache
def _grid_x() -> int:
    return max(1, 4 * cp.cuda.Device().attributes["MultiProcessorCount"] // K)  # ~4 blocks an SM a launch


@functools.cache
def _sink(device: int):
    return cp.zeros(1, cp.uint64)


def launch_token(base: int, token) -> None:
    """One kernel launch a layer on the current stream, each reading the layer's K experts from address `base` on."""
    sink = _sink(cp.cuda.Device().id)
    for _, offsets in token:
        _READ((_grid_x(), K), (256,), (cp.uint64(base), offsets, cp.int64(EXPERT_BYTES // 16), sink))


def copy_token(base: int, staging: int, token, stream: int) -> None:
    """The copy engine's way: each layer's K experts copied from address `base` on into K staging slots on the GPU."""
    for offsets, _ in token:
        for i, off in enumerate(offsets):
            cp.cuda.runtime.memcpyAsync(staging + i * EXPERT_BYTES, base + int(off), EXPERT_BYTES,
                                        cp.cuda.runtime.memcpyHostToDevice, stream)


def main(out_path: str, host_gib: float) -> None:
    n_experts = int(host_gib * (1 << 30)) // EXPERT_BYTES
    nbytes = n_experts * EXPERT_BYTES
    host = cp.cuda.alloc_pinned_memory(nbytes)  # cudaHostAlloc: mapped, same address on the GPU (UVA)
    view, block = np.frombuffer(host, np.uint8, nbytes), np.random.default_rng(0).bytes(64 << 20)
    for at in range(0, nbytes, len(block)):  # incompressible bytes, 64 MiB at a time
        view[at:at + len(block)] = np.frombuffer(block, np.uint8)[:nbytes - at]
    dev = cp.empty(nbytes, cp.uint8)
    dev.data.copy_from_host(host.ptr, nbytes)
    staging = cp.empty(K * EXPERT_BYTES, cp.uint8)
    stream = cp.cuda.get_current_stream()

    def zero_copy(token):
        launch_token(host.ptr, token)
        stream.synchronize()

    def from_hbm(token):
        launch_token(dev.data.ptr, token)
        stream.synchronize()

    def copy_engine(token):
        copy_token(host.ptr, staging.data.ptr, token, stream.ptr)
        stream.synchronize()

    token_bytes = LAYERS * K * EXPERT_BYTES
    rows = {}
    for name, run_token in (("zero-copy kernel (pinned host)", zero_copy), ("kernel from HBM (launch-bound)", from_hbm),
                            ("copy engine, host to device", copy_engine)):
        runs = [token_bytes / per_token(run_token, [token_offsets(random.Random(r), n_experts) for _ in range(TOKENS)])
                / 1e9 for r in range(REPEATS)]
        rows[name] = {"gbps_runs": runs, "gbps_median": statistics.median(runs),
                      "ms_per_token": token_bytes / statistics.median(runs) / 1e6}
        print(f"{name:32s} {rows[name]['gbps_median']:7.1f} GB/s ({', '.join(f'{g:.1f}' for g in runs)}); "
              f"{rows[name]['ms_per_token']:.2f} ms for {token_bytes / 1e9:.2f} GB", flush=True)
    with open(out_path, "w") as f:
        json.dump({"expert_bytes": EXPERT_BYTES, "layers": LAYERS, "k": K, "host_bytes": nbytes, "modes": rows}, f,
                  indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 4.0)
