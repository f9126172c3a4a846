"""CPU compute rate: llama.cpp decoding a few of the model's own blocks on the CPU, at the thread count
the runtime uses (llama.cpp's default: the physical cores).

The blocks are copied into files of their own (model_slice.py) and loaded, in a process of its own (so
the caller's memory and its peak stay the run's), as the runtime holds CPU-computed weights (read into
plain host memory, repacked where llama.cpp repacks). Decode steps are timed with `top` blocks and with
`base` (fewer), taking turns: the decode rate is the bytes a token reads of the extra blocks over the
time they add, so per-token costs (the graph's set-up, the input row) cancel while
per-block ones (thread barriers, an MoE block's router) stay in the rate, as in the whole model. Bytes
and weights are counted as the planner counts them (hypura.plan.units: an expert at k/E). The prefill
rate is 2 FLOP per weight of a prompt the same way. Without llama.cpp or a model, the RAM copy rate
stands in (a proxy, and the method says so).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hypura.errors import HypuraError
from hypura.modelfile import ModelHeader, read_header
from hypura.profile import knobs
from hypura.profile.model import CpuCompute
from hypura.profile.model_slice import slices


def block_counts(header: ModelHeader) -> tuple[int, int]:
    """(base, top): one block, and one plus as many as knobs.SLICE_BYTES holds (at least one, at most all)."""
    n = header.n_layer
    if n < 2:
        return 1, 1  # nothing to take a difference with: the step's time is the rate's
    block = sum(t.nbytes for t in header.tensors if t.layer == 0)
    return 1, 1 + max(1, min(n - 1, knobs.SLICE_BYTES // max(block, 1)))


def token_load(header: ModelHeader, blocks: int) -> tuple[float, float]:
    """(bytes, weights) a decode token reads of the first `blocks` blocks, as the planner counts them."""
    from hypura.plan.units import model_units

    units = [u for u in model_units(header).units if 0 <= u.layer < blocks]
    return sum(u.p * u.nbytes for u in units), sum(u.p * u.elements for u in units)


@contextlib.contextmanager
def _quiet_stderr():
    """llama.cpp logs from C to fd 2; keep the profile's progress readable."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class _Steps:
    """One loaded slice and its next position: decode steps that ask for no logits."""

    def __init__(self, path: Path, threads: int):
        import llama_cpp

        from hypura.llama import Llama

        n = knobs.LLAMA_PROMPT_TOKENS
        with _quiet_stderr():  # on a GPU build too: the CPU alone computes, from plain (not pinned) memory
            self.llm = Llama(str(path), n_gpu_layers=0, fit=False, n_ctx=knobs.LLAMA_CTX, n_batch=n, n_ubatch=n,
                             n_threads=threads, n_threads_batch=threads, offload_kqv=False, op_offload=False,
                             verbose=False, param_overrides={"model_params": {
                                 "load_mode": llama_cpp.LLAMA_LOAD_MODE_NONE, "no_host": True}})
        self.batch = llama_cpp.llama_batch_init(n, 0, 1)
        self.pos, self.name = 0, path.name

    def __call__(self, tokens: list[int]) -> float:
        import llama_cpp

        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, self.pos + i, 1, 0
            b.seq_id[i][0] = 0
        t0 = time.perf_counter()
        if llama_cpp.llama_decode(self.llm.ctx, b) != 0:
            raise HypuraError(f"llama_decode failed on {self.name}")
        self.pos += len(tokens)
        return time.perf_counter() - t0

    def close(self) -> None:
        import llama_cpp

        llama_cpp.llama_batch_free(self.batch)
        self.llm.close()


def time_steps(paths: list[Path], threads: int, n_vocab: int) -> list[tuple[float, float]]:
    """For each model: (median seconds of a one-token decode step, seconds of a knobs.LLAMA_PROMPT_TOKENS
    prompt) on the CPU. The models take turns, step by step, so that a load on the machine that comes and
    goes weighs on each alike."""
    tokens = [(7 + 13 * i) % n_vocab for i in range(knobs.LLAMA_PROMPT_TOKENS)]
    runs = []
    try:
        for p in paths:
            runs.append(_Steps(p, threads))
        for run in runs:
            run(tokens)  # warm-up: caches, buffers, an MoE block's experts (most of them)
        prompt = [min(run(tokens) for _ in range(2)) for run in runs]
        steps: list[list[float]] = [[] for _ in runs]
        t0 = time.perf_counter()
        for i in range(knobs.LLAMA_DECODE_TOKENS):
            if i >= 3 and time.perf_counter() - t0 > knobs.LLAMA_DECODE_S:
                break
            for run, out in zip(runs, steps):
                out.append(run([tokens[i % len(tokens)]]))
        return [(statistics.median(s), p) for s, p in zip(steps, prompt)]
    finally:
        for run in runs:
            run.close()


def time_steps_apart(paths: list[Path], threads: int, n_vocab: int) -> list[tuple[float, float]]:
    """time_steps in a child process: the loaded blocks never count in the caller's RSS peak (a first plan's
    run budgets that), and llama.cpp's threads and state go with the child."""
    args = [sys.executable, "-m", __name__, str(threads), str(n_vocab), *map(str, paths)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=knobs.LLAMA_TIMEOUT_S)
    if r.returncode != 0:
        lines = (r.stderr.strip() or "no output").splitlines()
        raise HypuraError(f"timing the model's blocks failed: {lines[-1]}")
    values = list(map(float, r.stdout.split()))
    return list(zip(values[::2], values[1::2]))


def measure_model(model: Path, threads: int, folder: Path,
                  progress: Callable[[str], None] = lambda _: None) -> CpuCompute:
    """The CPU's decode and prefill rates on `model`'s own blocks (module docstring); `folder` holds the
    copies of them while they are timed."""
    from hypura.plan.units import ModelDims

    header = read_header(model)
    base, top = block_counts(header)
    counts = sorted({base, top})
    size = sum(t.nbytes for t in header.tensors if 0 <= t.layer < top) + (base < top) * sum(
        t.nbytes for t in header.tensors if 0 <= t.layer < base)
    progress(f"llama.cpp decodes {' and '.join(map(str, counts))} of {model.name}'s {header.n_layer} blocks "
             f"({size / 1e9:.2f} GB copied) on {threads} thread(s)")
    with slices(header, counts, folder) as paths:
        times = dict(zip(counts, time_steps_apart([paths[n] for n in counts], threads,
                                                  ModelDims.from_header(header).n_vocab)))
    (top_b, top_w), (base_b, base_w) = token_load(header, top), token_load(header, base)
    (top_s, top_p), (base_s, base_p) = times[top], times[base]
    prompt = knobs.LLAMA_PROMPT_TOKENS
    if top > base and top_s > base_s and top_p > base_p:
        decode_bw, flops = (top_b - base_b) / (top_s - base_s), 2.0 * (top_w - base_w) * prompt / (top_p - base_p)
        how = f"{top - base} more block(s) added {(top_s - base_s) * 1e3:.2f} ms to a {base_s * 1e3:.2f} ms step"
    else:  # one block, or noise larger than the blocks' time: the whole step, its fixed costs included
        decode_bw, flops = top_b / top_s, 2.0 * top_w * prompt / top_p
        how = f"a step of {top} block(s) took {top_s * 1e3:.2f} ms (fixed costs included: a lower bound)"
    progress(f"decode reads {decode_bw / 1e9:.1f} GB/s of weights, prefill {flops / 1e9:.0f} GFLOP/s")
    return CpuCompute(decode_bw=decode_bw, prefill_flops=flops, threads=threads,
                      method=(f"llama.cpp on {top} of {model.name}'s blocks ({top_b / top / 1e6:.0f} MB a token a "
                              f"block), {threads} thread(s): {how}; a {prompt}-token prompt {top_p * 1e3:.0f} ms with "
                              f"{top}, {base_p * 1e3:.0f} ms with {base}"))


def proxy(ram_copy_bw: float, threads: int, why: str) -> CpuCompute:
    return CpuCompute(decode_bw=ram_copy_bw, prefill_flops=knobs.CPU_FLOPS_DEFAULT, threads=threads,
                      method=f"proxy (no llama.cpp run: {why}): decode = RAM copy rate, prefill = planner default")


if __name__ == "__main__":  # time_steps_apart's child: THREADS N_VOCAB PATH... -> "decode_s prompt_s" per path
    for row in time_steps([Path(p) for p in sys.argv[3:]], int(sys.argv[1]), int(sys.argv[2])):
        print(*row)
