"""How fast can a GPU kernel read selected experts straight out of pinned host memory (zero-copy, over PCIe),
beside the copy engine moving the same bytes and the kernel reading them from HBM? (CuPy, no Hypura.)

    python3 bench/zero_copy_rate.py OUT.json [HOST_GIB] [CPU_THREADS]     (defaults: 4 GiB pinned, 12 threads)

Why: issue #5's last unmet speed target is 1.5x llama.cpp for the Qwen3-30B-A3B shape at 4 GiB of GPU and 24 GiB
of RAM, where every expert fits in RAM. llama.cpp (`-ncmoe 41`) computes 41 layers' experts on the CPU at ~62 GB/s
effective (0.94 GB a token of 19.2 ms). A 4 GiB GPU holds ~15% of the experts, whether whole layers or a cache, so
the rest must be computed where it lies or moved, and per-layer host round trips (0.21 ms x 41 = 8.6 ms) leave no
room for a host-driven split. One route remains: every layer's experts split statically between the CPU and GPU
kernels that read their share from pinned host memory, no host decision in the loop. Its ceiling is
0.94 GB / (62 GB/s + this zero-copy rate) plus the GPU's own work (assumed 3.5 ms:
attention, routers and the 7 layers' experts on the GPU, launches). Prediction: 35-50 GB/s for 8 random
experts of 2.86 MB a launch, so a ceiling of 1.3-1.5x: at or under the target.

A "token" here is 41 layers, each reading 8 random 2.86 MB experts (qwen3-30b-a3b Q4_K_M: gate and up Q4_K, down
Q6_K): a kernel launch a layer, or the CPU's threads, or both at once, each expert split between them in proportion
to their rates alone (the split's ceiling assumes both keep their rates; "at once" measures what survives).
Wall-clock per token, median of 8 after a warm-up, 5 repeats on other experts.
"""

import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import cupy as cp
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


def main(out_path: str, host_gib: float, cpu_threads: int) -> None:
    n_experts = int(host_gib * (1 << 30)) // EXPERT_BYTES
    nbytes = n_experts * EXPERT_BYTES
    host = cp.cuda.alloc_pinned_memory(nbytes)  # cudaHostAlloc: mapped, same address on the GPU (UVA)
    view, block = np.frombuffer(host, np.uint8, nbytes), np.random.default_rng(0).bytes(64 << 20)
    for at in range(0, nbytes, len(block)):  # incompressible bytes, 64 MiB at a time
        view[at:at + len(block)] = np.frombuffer(block, np.uint8)[:nbytes - at]
    words = view.view(np.uint64)
    dev = cp.empty(nbytes, cp.uint8)
    dev.data.copy_from_host(host.ptr, nbytes)
    staging = cp.empty(K * EXPERT_BYTES, cp.uint8)
    sink = cp.zeros(1, cp.uint64)
    stream = cp.cuda.get_current_stream()
    grid_x = max(1, 4 * cp.cuda.Device().attributes["MultiProcessorCount"] // K)  # ~4 blocks an SM a launch
    pool = ThreadPoolExecutor(cpu_threads)

    def launch(base: int, token, nbytes_each: int = EXPERT_BYTES) -> None:
        for _, offsets in token:
            _READ((grid_x, K), (256,), (cp.uint64(base), offsets, cp.int64(nbytes_each // 16), sink))

    def cpu_read(token, skip: int = 0) -> None:
        """cpu_threads threads XOR every 8-byte word of each layer's experts, from byte `skip` of each on."""
        for offsets, _ in token:
            ranges = [((off + skip) // 8, (off + EXPERT_BYTES) // 8) for off in offsets]
            chunks = [(a + (b - a) * t // cpu_threads, a + (b - a) * (t + 1) // cpu_threads)
                      for a, b in ranges for t in range(cpu_threads)]
            list(pool.map(lambda c: np.bitwise_xor.reduce(words[c[0]:c[1]]), chunks))

    def zero_copy(token):
        launch(host.ptr, token)
        stream.synchronize()

    def from_hbm(token):
        launch(dev.data.ptr, token)
        stream.synchronize()

    def copy_engine(token):
        for offsets, _ in token:
            for i, off in enumerate(offsets):
                cp.cuda.runtime.memcpyAsync(staging.data.ptr + i * EXPERT_BYTES, host.ptr + int(off), EXPERT_BYTES,
                                            cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        stream.synchronize()

    token_bytes = LAYERS * K * EXPERT_BYTES
    rows = {}

    def measure(name: str, run_token) -> float:
        runs = [token_bytes / per_token(run_token, [token_offsets(random.Random(r), n_experts) for _ in range(TOKENS)])
                / 1e9 for r in range(REPEATS)]
        rows[name] = {"gbps_runs": runs, "gbps_median": statistics.median(runs),
                      "ms_per_token": token_bytes / statistics.median(runs) / 1e6}
        print(f"{name:40s} {rows[name]['gbps_median']:7.1f} GB/s ({', '.join(f'{g:.1f}' for g in runs)}); "
              f"{rows[name]['ms_per_token']:.2f} ms for {token_bytes / 1e9:.2f} GB", flush=True)
        return rows[name]["gbps_median"]

    zc = measure("zero-copy kernel (pinned host)", zero_copy)
    measure("kernel from HBM (launch-bound)", from_hbm)
    measure("copy engine, host to device", copy_engine)
    cpu = measure(f"CPU, {cpu_threads} threads (numpy XOR)", cpu_read)
    gpu_part = int(EXPERT_BYTES * zc / (zc + cpu)) // 256 * 256  # each expert split by the solo rates

    def both(token):  # the GPU reads the first gpu_part bytes of every expert while the CPU reads the rest
        launch(host.ptr, token, gpu_part)
        cpu_read(token, skip=gpu_part)
        stream.synchronize()

    together = measure("CPU and zero-copy kernel at once, split", both)
    cpu_gbps, gpu_ms, vanilla_ms = 62.0, 3.5, 19.2  # llama.cpp -ncmoe 41 (bench/RESULTS.md): its CPU share, the rest
    share = together / (zc + cpu)  # how much of the two solo rates survives running at once
    ceiling_ms = token_bytes / 1e9 / ((cpu_gbps + zc) * share) * 1e3 + gpu_ms
    print(f"at once: {share:.2f} of the solo rates' sum. A static CPU+GPU split of every layer's experts: "
          f">= {ceiling_ms:.1f} ms a token, at most {vanilla_ms / ceiling_ms:.2f}x llama.cpp's {vanilla_ms} ms")
    pool.shutdown()
    with open(out_path, "w") as f:
        json.dump({"expert_bytes": EXPERT_BYTES, "layers": LAYERS, "k": K, "host_bytes": nbytes, "modes": rows,
                   "gpu_part_bytes": gpu_part, "split_ceiling": {
                       "cpu_gbps": cpu_gbps, "gpu_ms": gpu_ms, "vanilla_ms": vanilla_ms, "at_once_share": share,
                       "ms_per_token": ceiling_ms, "speedup_at_most": vanilla_ms / ceiling_ms}}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 4.0, int(sys.argv[3]) if len(sys.argv) > 3 else 12)
