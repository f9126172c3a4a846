"""The GPU's prompt rate on the model's own blocks: llama.cpp evaluating a prompt micro-batch of
knobs.GPU_PROMPT_TOKENS tokens with `base` and with `top` blocks (the slices compute.py times on the CPU), every
weight on the GPU. 2 FLOP per weight a token multiplies of the extra blocks, over the time they add: the rate of
this model's kernels at a prompt's size (an MoE's experts each see a share of the tokens: smaller, slower
matmuls than a dense model's), where the machine profile has one default for every model.
"""

from __future__ import annotations

import time
from pathlib import Path

from hypura.profile import measure_knobs as knobs


def time_prompts(paths: list[str], n_vocab: int) -> list[float]:
    """Best seconds of a knobs.GPU_PROMPT_TOKENS-token prompt of each slice, all of it on the first GPU; the
    slices take turns."""
    import llama_cpp

    from hypura.bindings.batch import Batch
    from hypura.bindings.model import BareModel
    from hypura.profile.apart import quiet_stderr

    n, seqs = knobs.GPU_PROMPT_TOKENS, 1 + knobs.GPU_PROMPT_REPEATS
    tokens = [(7 + 13 * i) % n_vocab for i in range(n)]
    runs, batch = [], Batch(n)
    with quiet_stderr():  # llama.cpp logs its loads and frees from C
        try:
            for p in paths:
                # each prompt a sequence of its own, in a cache stream of its own: each attends to its own cells
                runs.append(BareModel(p, {"n_gpu_layers": 999, "load_mode": llama_cpp.LLAMA_LOAD_MODE_NONE},
                                      {"n_ctx": n * seqs, "n_seq_max": seqs, "kv_unified": False, "n_batch": n,
                                       "n_ubatch": n, "offload_kqv": True}))
            return _best_prompts(runs, batch, tokens)
        finally:
            batch.close()
            for llm in runs:
                llm.close()


def _best_prompts(runs: list, batch, tokens: list[int]) -> list[float]:
    """Each run's best prompt of `tokens`, each prompt from position 0 of a sequence of its own, after a warm-up."""
    import llama_cpp

    n, b = len(tokens), batch.c
    b.n_tokens = n
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.logits[i] = t, i, 0

    def prompt(llm, seq: int) -> float:
        for i in range(n):
            b.seq_id[i][0] = seq
        t0 = time.perf_counter()
        if llama_cpp.llama_decode(llm.ctx, b) != 0:
            raise RuntimeError(f"llama_decode failed on a slice of {n} tokens")
        llama_cpp.llama_synchronize(llm.ctx)
        return time.perf_counter() - t0

    for llm in runs:
        prompt(llm, 0)  # warm-up: the kernels' first launch, the compute buffer's
    best = [float("inf")] * len(runs)
    for seq in range(1, 1 + knobs.GPU_PROMPT_REPEATS):
        best = [min(s, prompt(llm, seq)) for s, llm in zip(best, runs)]
    return best


def prompt_flops(weights: dict[int, float], seconds: dict[int, float]) -> float | None:
    """FLOP/s from {blocks: weights a token multiplies} and {blocks: prompt seconds}: the extra blocks' FLOPs over
    the time they add; with one slice, its own. None where the timings say nothing (noise larger than the blocks)."""
    n = knobs.GPU_PROMPT_TOKENS
    top, base = max(seconds), min(seconds)
    if top > base:
        dt, dw = seconds[top] - seconds[base], weights[top] - weights[base]
    else:
        dt, dw = seconds[top], weights[top]
    return 2.0 * dw * n / dt if dt > 0 and dw > 0 else None


def measure(paths: dict[int, Path], weights: dict[int, float], n_vocab: int) -> float | None:
    """The rate (module docstring), in a child process (apart.py: the GPU's memory and the slices' never stay in
    the caller); None where it cannot be had (no room on the GPU, a failed load): the profile's default stands."""
    from hypura.profile import apart

    counts = sorted(paths)
    try:
        seconds = apart.call(time_prompts, [str(paths[c]) for c in counts], n_vocab)
    except Exception:  # noqa: BLE001  (a rate the planner has a default for: never a failed profile)
        return None
    return prompt_flops(weights, dict(zip(counts, seconds)))
