"""How much of its solo rate does each side keep when llama.cpp decodes on the CPU while a GPU kernel reads random
experts straight out of pinned host memory (zero-copy)? Those are the two halves of a static CPU+GPU split of every
layer's experts, and both draw on the same DRAM. (CuPy and a llama-bench binary; no Hypura.)

    python3 bench/zero_copy_contention.py LLAMA_BENCH MODEL OUT.json [PAIRS] [LOAD]     (3 pairs, zero-copy)

LOAD is `zero-copy` (a kernel reads the experts from pinned host memory) or `copy-engine` (the same bytes copied
to GPU staging slots, the control: Hypura's streaming path).

zero_copy_rate.py times the kernel alone (its first version timed the CPU with numpy, which measured Python's
overhead, not DRAM), so the CPU side here is llama.cpp itself: `llama-bench -ngl 0` (every weight on the CPU, so
llama.cpp shares no GPU time slices with the load), alone and under the load, in ABBA order so the machine's drift
falls on both. The load's thread has the last core to itself and llama.cpp the others (-t cores-1), so the load's
wake-ups cannot stall llama.cpp's thread barriers. H200 (session 19): under zero-copy reads llama.cpp kept 0.12 of
its rate (on 16 cores or 15 alike), under the copy engine 0.86.

Concurrency: one load thread works token by token (41 launches or 41 x 8 copies of random experts, then a wait that
polls an event with 0.5 ms sleeps instead of spinning a core) and appends (time, bytes so far) after each token; the
main thread only sets `stop` and reads the samples after join(). The load's rate under llama.cpp is the median of its
0.25 s bins inside the llama-bench window (decode is most of that window; the model's load is the rest).
"""

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time

try:
    import cupy as cp
except ImportError:
    sys.exit(f"{__file__}: needs CuPy, on a machine with a CUDA GPU")

from zero_copy_rate import EXPERT_BYTES, LAYERS, K, copy_token, launch_token, token_offsets

CPU_GBPS, GPU_MS, VANILLA_MS = 62.0, 3.5, 19.2  # llama.cpp -ncmoe 41 at 24 GiB (bench/RESULTS.md): its CPU share
CPU_TOKEN_GB = 0.94  # the 41 CPU layers' selected experts, the bytes a split would share between CPU and GPU


class GpuReadLoad:
    """Reads random experts from pinned host memory with the GPU until stopped; samples its progress."""

    def __init__(self, host, n_experts: int, copy_engine: bool):
        rng = random.Random(0)  # tokens drawn before the timing: a token's offsets cost 41 small copies to the GPU
        self.host, self.tokens, self.samples = host, [token_offsets(rng, n_experts) for _ in range(16)], []
        self.stop, self.thread = threading.Event(), None
        self.staging = cp.empty(K * EXPERT_BYTES, cp.uint8) if copy_engine else None

    def start(self):
        self.samples, self.stop = [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def finish(self) -> list[tuple[float, int]]:
        self.stop.set()
        self.thread.join()
        return self.samples

    def _run(self):
        done, stream = 0, cp.cuda.Stream(non_blocking=True)
        with stream:
            while not self.stop.is_set():
                token = self.tokens[len(self.samples) % len(self.tokens)]
                if self.staging is None:
                    launch_token(self.host.ptr, token)
                else:
                    copy_token(self.host.ptr, self.staging.data.ptr, token, stream.ptr)
                done_event = stream.record()
                while not done_event.done:  # polled with sleeps: a spinning sync would take a core from llama.cpp
                    time.sleep(0.0005)
                done += LAYERS * K * EXPERT_BYTES
                self.samples.append((time.perf_counter(), done))


def binned_gbps(samples, t0: float, t1: float, width: float = 0.25) -> list[float]:
    """GB/s in each whole `width`-second bin of [t0, t1], from cumulative (time, bytes) samples."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    rates, start = [], 0
    for i in range(1, len(inside)):
        if inside[i][0] - inside[start][0] >= width:
            rates.append((inside[i][1] - inside[start][1]) / (inside[i][0] - inside[start][0]) / 1e9)
            start = i
    return rates


def llama_bench(binary: str, model: str, cores: set[int]) -> dict:
    run = subprocess.run([binary, "-m", model, "-ngl", "0", "-t", str(len(cores)), "-p", "0", "-n", "64", "-r", "3",
                          "-o", "json"], capture_output=True, text=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, cores))
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
        sys.exit(f"llama-bench failed ({run.returncode}): {last}")
    row = json.loads(run.stdout)[0]
    return {"avg_ts": row["avg_ts"], "samples_ts": row["samples_ts"]}


def main(binary: str, model: str, out_path: str, pairs: int, load_kind: str) -> None:
    cores = sorted(os.sched_getaffinity(0))
    llama_cores = set(cores[:-1])
    os.sched_setaffinity(0, {cores[-1]})  # this process, and the load thread started later, on the last core
    n_experts = (4 << 30) // EXPERT_BYTES
    host = cp.cuda.alloc_pinned_memory(n_experts * EXPERT_BYTES)
    load = GpuReadLoad(host, n_experts, copy_engine=load_kind == "copy-engine")

    def load_alone(seconds: float = 3.0) -> float:
        load.start()
        time.sleep(seconds)
        samples = load.finish()
        return statistics.median(binned_gbps(samples, samples[0][0], samples[-1][0]))

    rows = {"load_alone_gbps": [load_alone()], "llama_alone": [], "llama_loaded": [], "load_meanwhile_gbps": []}
    for pair in range(pairs):
        for loaded in ((False, True) if pair % 2 == 0 else (True, False)):  # ABBA
            if loaded:
                load.start()
                time.sleep(0.5)
            t0 = time.perf_counter()
            result = llama_bench(binary, model, llama_cores)
            t1 = time.perf_counter()
            if loaded:
                rate = statistics.median(binned_gbps(load.finish(), t0, t1))
                rows["load_meanwhile_gbps"].append(rate)
            rows["llama_loaded" if loaded else "llama_alone"].append(result)
            print(f"pair {pair}: llama.cpp -ngl 0 -t {len(llama_cores)} {result['avg_ts']:.2f} tok/s"
                  + (f", {load_kind} {rate:.1f} GB/s meanwhile" if loaded else ", alone"), flush=True)
    rows["load_alone_gbps"].append(load_alone())

    alone_gbps = statistics.median(rows["load_alone_gbps"])
    cpu_share = statistics.median(r["avg_ts"] for r in rows["llama_loaded"]) / statistics.median(
        r["avg_ts"] for r in rows["llama_alone"])
    load_share = statistics.median(rows["load_meanwhile_gbps"]) / alone_gbps
    ceiling_ms = CPU_TOKEN_GB / (CPU_GBPS * cpu_share + alone_gbps * load_share) * 1e3 + GPU_MS
    print(f"{load_kind} alone {alone_gbps:.1f} GB/s; at once llama.cpp keeps {cpu_share:.2f} of its rate and the load "
          f"{load_share:.2f} of its own.", flush=True)
    if load_kind == "zero-copy":
        print(f"A static CPU+GPU split of every layer's experts: >= {ceiling_ms:.1f} ms a "
              f"token, at most {VANILLA_MS / ceiling_ms:.2f}x llama.cpp's {VANILLA_MS} ms (target 1.5x)", flush=True)
    rows["load"] = load_kind
    rows["split_ceiling"] = {"cpu_gbps": CPU_GBPS, "gpu_ms": GPU_MS, "vanilla_ms": VANILLA_MS, "cpu_share": cpu_share,
                             "load_share": load_share, "ms_per_token": ceiling_ms,
                             "speedup_at_most": VANILLA_MS / ceiling_ms}
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    kind = sys.argv[5] if len(sys.argv) > 5 else "zero-copy"
    if kind not in ("zero-copy", "copy-engine"):
        sys.exit(f"LOAD must be zero-copy or copy-engine, not {kind!r}")
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 3, kind)
