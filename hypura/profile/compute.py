"""CPU compute rate: llama.cpp decoding a few of the model's own blocks on the CPU, at the thread count
the runtime uses (llama.cpp's default: the physical cores).

The blocks are copied into files of their own (model_slice.py) and loaded, in a child process (apart.py),
as the runtime holds CPU-computed weights (read into
plain host memory, repacked where llama.cpp repacks). Decode steps are timed with `base` blocks and with
`top` (more), taking turns so that a load on the machine weighs on each alike, and with `top` blocks and
the output head. From them: the blocks' rate (the extra blocks' bytes over the time they add: per-block
costs, such as an MoE block's router, included), the head's time and the step's fixed part. The decode
rate is what a token of the whole model reads over the time those give it (all its blocks at the blocks'
rate, the head, the fixed part), as a run of the whole model on the CPU would measure it: a small model's
output head is a large share of its token, and may run at another rate than its blocks. The `top` blocks are
timed once more from ggml's plain layout (no repacking), as a plan that streams to a GPU holds its CPU weights
(pinned): the median ratio of paired steps scales the decode rate to `decode_bw_plain`. Bytes and weights are counted as the planner counts them (hypura.units: an expert at k/E).
The prefill rate is 2 FLOP per weight of the extra blocks over a prompt's extra time. A step of several tokens
(knobs.LLAMA_BATCH_TOKENS) is timed too, and with the prompt gives `batch_gain`: how much faster such steps ran than
the cost model's sum of the one-token rate and the prefill rate says. Without llama.cpp or
a model, the RAM copy rate stands in (a proxy, and the method says so).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from hypura.errors import HypuraError
from hypura.modelfile import ModelHeader, read_header
from hypura.profile import apart, measure_knobs as knobs
from hypura.profile.machine import CpuCompute
from hypura.profile.model_slice import slices


def block_counts(header: ModelHeader) -> tuple[int, int]:
    """(base, top): one block, and one plus as many as knobs.SLICE_BYTES holds (at least one, at most all)."""
    n = header.n_layer
    if n < 2:
        return 1, 1  # nothing to take a difference with: the step's time is the rate's
    block = sum(t.nbytes for t in header.tensors if t.layer == 0)
    return 1, 1 + max(1, min(n - 1, knobs.SLICE_BYTES // max(block, 1)))


def token_load(header: ModelHeader, blocks: int, tokens: int = 1) -> tuple[float, float]:
    """(bytes, weights) a decode step of `tokens` tokens reads of the first `blocks` blocks, as the planner counts
    them (an expert when any token selects it; weights a token multiplies)."""
    from hypura.step_time import step_probability
    from hypura.units import model_units

    units = [u for u in model_units(header).units if 0 <= u.layer < blocks]
    return sum(step_probability(u.p, tokens) * u.nbytes for u in units), sum(u.p * u.elements for u in units)


class _Steps:
    """One loaded slice and its next position: decode steps, with the last token's logits or none (then the
    output head is not computed)."""

    def __init__(self, path: Path, threads: int, plain: bool = False):
        import llama_cpp

        from hypura.bindings.batch import Batch
        from hypura.bindings.model import BareModel

        n = knobs.LLAMA_PROMPT_TOKENS
        with apart.quiet_stderr():  # on a GPU build too: the CPU alone computes, from plain (not pinned) memory
            # plain: ggml's own layout, as a plan holds pinned CPU weights; else repacked where llama.cpp repacks
            self.llm = BareModel(str(path), {"n_gpu_layers": 0, "load_mode": llama_cpp.LLAMA_LOAD_MODE_NONE,
                                          "no_host": True, **({"use_extra_bufts": False} if plain else {})},
                              {"n_ctx": knobs.LLAMA_CTX, "n_batch": n, "n_ubatch": n, "n_threads": threads,
                               "n_threads_batch": threads, "offload_kqv": False, "op_offload": False})
        self.batch = Batch(n)
        self.pos, self.name = 0, path.name

    def __call__(self, tokens: list[int], logits: bool = False) -> float:
        import llama_cpp

        b = self.batch.c
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.logits[i], b.seq_id[i][0] = t, self.pos + i, 0, 0
        b.logits[len(tokens) - 1] = int(logits)
        t0 = time.perf_counter()
        if llama_cpp.llama_decode(self.llm.ctx, b) != 0:  # the CPU decodes synchronously: timed as it is
            raise HypuraError(f"llama_decode failed on {self.name}")
        self.pos += len(tokens)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.batch.close()
        self.llm.close()


def time_steps(paths: list[str], threads: int, n_vocab: int,
               plain: bool = False) -> tuple[list[tuple[float, float, float]], float | None]:
    """For each model: median seconds of a one-token decode step without logits and with them, and seconds of
    a knobs.LLAMA_PROMPT_TOKENS prompt, on the CPU; the models take turns, step by step. plain: also the last
    model's weights in ggml's plain layout, timed beside it step for step: the median of the paired ratios
    (repacked step / plain step, at most 1), else None."""
    tokens = [(7 + 13 * i) % n_vocab for i in range(knobs.LLAMA_PROMPT_TOKENS)]
    runs, unpacked = [], None
    try:
        for p in paths:
            runs.append(_Steps(Path(p), threads))
        if plain:
            unpacked = _Steps(Path(paths[-1]), threads, plain=True)
            unpacked(tokens)
        for run in runs:
            run(tokens)  # warm-up: caches, buffers, an MoE block's experts (most of them)
        prompt = [min(run(tokens) for _ in range(2)) for run in runs]
        steps: list[tuple[list[float], list[float]]] = [([], []) for _ in runs]
        ratios = []
        t0 = time.perf_counter()
        for i in range(knobs.LLAMA_DECODE_TOKENS):
            if i >= 3 and time.perf_counter() - t0 > knobs.LLAMA_DECODE_S:
                break
            for run, (bare, head) in zip(runs, steps):
                # another token for the head's step: the same one would find its experts in the CPU's caches
                bare.append(run([tokens[2 * i % len(tokens)]]))
                head.append(run([tokens[(2 * i + 1) % len(tokens)]], logits=True))
            if unpacked is not None:  # paired with the step just before it: a load on the machine weighs on both
                ratios.append(steps[-1][0][-1] / unpacked([tokens[2 * i % len(tokens)]]))
        share = min(1.0, statistics.median(ratios)) if ratios else None
        batch = _batch_steps(runs, tokens)
        return [(statistics.median(bare), statistics.median(head), p, b)
                for (bare, head), p, b in zip(steps, prompt, batch)], share
    finally:
        for run in runs + ([unpacked] if unpacked is not None else []):
            run.close()


def _batch_steps(runs: list, tokens: list[int]) -> list[float]:
    """Median seconds of a knobs.LLAMA_BATCH_TOKENS-token decode step (no logits) of each run, taking turns;
    each step's tokens are new ones, so that its experts are not the last step's."""
    k, times = knobs.LLAMA_BATCH_TOKENS, [[] for _ in runs]
    t0 = time.perf_counter()
    for i in range(knobs.LLAMA_BATCH_STEPS):
        if i >= 1 and time.perf_counter() - t0 > knobs.LLAMA_BATCH_S:
            break
        step = [tokens[(3 * (k * i + j) + 1) % len(tokens)] for j in range(k)]
        for run, t in zip(runs, times):
            t.append(run(step))
    return [statistics.median(t) for t in times]


def measure_model(model: Path, threads: int, folder: Path,
                  progress: Callable[[str], None] = lambda _: None) -> CpuCompute:
    """The CPU's decode and prefill rates on `model`'s own blocks (module docstring); `folder` holds the
    copies of them while they are timed."""
    from hypura.units import ModelDims

    header = read_header(model)
    base, top = block_counts(header)
    counts = sorted({base, top})
    size = sum(t.nbytes for t in header.tensors if 0 <= t.layer < top) + (base < top) * sum(
        t.nbytes for t in header.tensors if 0 <= t.layer < base)
    progress(f"llama.cpp decodes {' and '.join(map(str, counts))} of {model.name}'s {header.n_layer} blocks "
             f"({size / 1e9:.2f} GB copied) on {threads} thread(s)")
    with slices(header, counts, folder) as paths:
        # apart: the blocks loaded never count in the caller's RSS peak
        timed, share = apart.call(time_steps, [str(paths[n]) for n in counts], threads,
                                  ModelDims.from_header(header).n_vocab, True)  # and the plain layout
        gpu_flops = _gpu_prompts(header, paths, counts, progress)
    times = dict(zip(counts, timed))
    cpu = _rates(header, model.name, threads, base, top, times)
    # the same `top` blocks read from the plain layout: the steps' paired ratio scales the rate
    plain_bw = cpu.decode_bw * share
    progress(f"decode reads {cpu.decode_bw / 1e9:.1f} GB/s of weights ({plain_bw / 1e9:.1f} unrepacked), "
             f"prefill {cpu.prefill_flops / 1e9:.0f} GFLOP/s")
    return dataclasses.replace(cpu, decode_bw_plain=plain_bw, gpu_prefill_flops=gpu_flops)


def _gpu_prompts(header: ModelHeader, paths: dict, counts: list[int], progress: Callable[[str], None]) -> float | None:
    """The GPU's prompt rate on the same slices (gpu_compute.py), None without a GPU."""
    from hypura.profile import gpu_compute
    from hypura.profile.devices import has_gpu
    from hypura.units import ModelDims

    if not has_gpu():
        return None
    progress(f"the GPU evaluates {knobs.GPU_PROMPT_TOKENS}-token prompts on the same blocks")
    flops = gpu_compute.measure({c: paths[c] for c in counts}, {c: token_load(header, c)[1] for c in counts},
                                ModelDims.from_header(header).n_vocab)
    progress(f"GPU prompts {flops / 1e12:.0f} TFLOP/s" if flops else "GPU prompts not timed: the default rate stands")
    return flops


def _rates(header: ModelHeader, name: str, threads: int, base: int, top: int, times: dict) -> CpuCompute:
    """CpuCompute from the timings (module docstring): times[n] = (decode s, decode s with the head, prompt s,
    batched step s)."""
    (top_b, top_w), (base_b, base_w) = token_load(header, top), token_load(header, base)
    # the head timed beside `top` blocks: beside fewer, more of its bytes stay in the CPU's caches between tokens
    (top_s, head_s, top_p, _), (base_s, _, base_p, _) = times[top], times[base]
    prompt = knobs.LLAMA_PROMPT_TOKENS
    if top > base and top_s > base_s:
        block_bw = (top_b - base_b) / (top_s - base_s)
        how = f"{top - base} more block(s) added {(top_s - base_s) * 1e3:.2f} ms to a {base_s * 1e3:.2f} ms step"
    else:  # one block, or noise larger than the blocks' time: the step's fixed part is not told apart
        block_bw = top_b / top_s
        how = f"a step of {top} block(s) took {top_s * 1e3:.2f} ms"
    fixed_s = max(0.0, base_s - base_b / block_bw)
    head_s = max(0.0, head_s - top_s)
    blocks_b, _ = token_load(header, header.n_layer)
    head_b = sum(t.nbytes for t in header.tensors if t.name == _head_name(header))
    decode_bw = (blocks_b + head_b) / (fixed_s + blocks_b / block_bw + head_s)
    if top > base and top_p > base_p:
        flops = 2.0 * (top_w - base_w) * prompt / (top_p - base_p)
    else:
        flops = 2.0 * top_w * prompt / top_p
    gains = _batch_gains(header, base, top, times, block_bw, flops)
    return CpuCompute(decode_bw=decode_bw, prefill_flops=flops, threads=threads, batch_gain=gains, method=(
        f"llama.cpp on {top} of {name}'s blocks ({top_b / top / 1e6:.0f} MB a token a block), {threads} thread(s): "
        f"{how} ({block_bw / 1e9:.1f} GB/s), the output head {head_s * 1e3:.2f} ms; a token of all {header.n_layer} "
        f"blocks and the head at those times; a {prompt}-token prompt {top_p * 1e3:.0f} ms with {top} block(s), {base_p * 1e3:.0f} ms with {base}"
        + "".join(f"; a {k}-token step in {1 / g:.2f} of the time the cost model sums" for k, g in gains)))


def _batch_gains(header: ModelHeader, base: int, top: int, times: dict, block_bw: float,
                 flops: float) -> tuple[tuple[int, float], ...]:
    """((tokens, gain), ...) for the batched step and the prompt: the cost model's time for the extra blocks of
    such a step (plan/cost.py batch_compute_s: the bytes it reads at the one-token rate, its further tokens at the
    prefill rate) over the time they took. A step's tokens share the reads (several select an expert, a weight
    row serves all of them) more than that sum says."""
    from hypura.step_time import batch_compute_s

    out = []
    for tokens, at in ((knobs.LLAMA_BATCH_TOKENS, 3), (knobs.LLAMA_PROMPT_TOKENS, 2)):
        (top_b, top_w), (base_b, base_w) = token_load(header, top, tokens), token_load(header, base, tokens)
        if top == base:  # one block: the step's whole time, its fixed part with it
            base_b = base_w = 0.0
        took = times[top][at] - (times[base][at] if top > base else 0.0)
        model = batch_compute_s(top_b - base_b, 2.0 * tokens * (top_w - base_w), block_bw, flops, tokens)
        if took > 0 and model > 0:  # noise larger than the blocks' time says nothing
            out.append((tokens, model / took))
    return tuple(out)


def _head_name(header: ModelHeader) -> str:
    """The output matrix: output.weight, or the input embeddings where the model ties them."""
    names = {t.name for t in header.tensors}
    return "output.weight" if "output.weight" in names else "token_embd.weight"


def proxy(ram_copy_bw: float, threads: int, why: str) -> CpuCompute:
    return CpuCompute(decode_bw=ram_copy_bw, prefill_flops=knobs.CPU_FLOPS_DEFAULT, threads=threads,
                      method=f"proxy (no llama.cpp run: {why}): decode = RAM copy rate, prefill = planner default")

