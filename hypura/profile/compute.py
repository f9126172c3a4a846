"""CPU compute rate: a short llama.cpp run (through llama-cpp-python on our library).

Decode rate = weight bytes a token reads x tokens/s; prefill rate = 2 FLOP per weight x prompt
tokens/s. With a small model (the default SmolLM2-135M) per-token overhead is a larger share, so the
decode rate is a lower bound; pass a bigger model (`hypura profile --model`) for a tighter figure.
Without llama.cpp the RAM copy rate stands in (a proxy, and the method says so).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from hypura.modelfile import read_header
from hypura.profile import knobs
from hypura.profile.model import CpuCompute


def _decode_weights(path: Path) -> tuple[int, int]:
    """(bytes, weights) a decode token reads: every tensor but the input embeddings, which only give
    one row (unless tied: then they are the output matrix too)."""
    h = read_header(path)
    tied = not any(t.name == "output.weight" for t in h.tensors)
    nbytes = elements = 0
    for t in h.tensors:
        if t.name == "token_embd.weight" and not tied:
            continue
        n = 1
        for d in t.shape:
            n *= d
        nbytes, elements = nbytes + t.nbytes, elements + n
    return nbytes, elements


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


def _decode_rate(llm, prompt: list[int]) -> float:
    """Single-token decode steps until the count or the time limit (at least one)."""
    t0 = time.perf_counter()
    n = 0
    while n < knobs.LLAMA_DECODE_TOKENS and (n < 1 or time.perf_counter() - t0 < knobs.LLAMA_DECODE_S):
        llm.eval([prompt[n % len(prompt)]])
        n += 1
    return n / (time.perf_counter() - t0)


def measure_llama(model: Path, threads: int) -> CpuCompute:
    """Decode with one thread and with `threads`, keep the faster (ggml's spinning thread pool
    collapses on a loaded machine: 2 busy cores gave 0.2 tok/s with 2 threads, 21 with 1), then
    time a prompt with that thread count."""
    from hypura.bindings.library import point_llama_cpp_at_our_library

    point_llama_cpp_at_our_library()
    import llama_cpp

    nbytes, elements = _decode_weights(model)
    with _quiet_stderr():  # on a GPU build too: the CPU alone computes
        llm = llama_cpp.Llama(model_path=str(model), n_ctx=knobs.LLAMA_CTX, n_batch=knobs.LLAMA_PROMPT_TOKENS,
                              n_threads=1, n_threads_batch=1, n_gpu_layers=0, verbose=False,
                              offload_kqv=False, op_offload=False)
    try:
        prompt = llm.tokenize(b"Hypura measures how fast this machine reads weights. " * 16)
        prompt = prompt[: knobs.LLAMA_PROMPT_TOKENS]
        llm.eval(prompt[:4])  # warm-up: first-touch of the weights and buffers
        rates = {}
        for n in sorted({1, max(1, threads)}):
            llama_cpp.llama_set_n_threads(llm.ctx, n, n)
            rates[n] = _decode_rate(llm, prompt)
        best = max(rates, key=rates.get)
        llama_cpp.llama_set_n_threads(llm.ctx, best, best)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        pp_s = len(prompt) / (time.perf_counter() - t0)
    finally:
        llm.close()
    tried = ", ".join(f"{n} thread(s) {r:.1f}" for n, r in rates.items())
    return CpuCompute(
        decode_bw=nbytes * rates[best], prefill_flops=2.0 * elements * pp_s, threads=best,
        method=(f"llama.cpp on {model.name} ({nbytes / 1e6:.0f} MB read per token): decode tok/s with {tried}; "
                f"prefill {pp_s:.1f} tok/s ({len(prompt)}-token prompt, {best} thread(s))"),
    )


def proxy(ram_copy_bw: float, threads: int, why: str) -> CpuCompute:
    return CpuCompute(decode_bw=ram_copy_bw, prefill_flops=knobs.CPU_FLOPS_DEFAULT, threads=threads,
                      method=f"proxy (no llama.cpp run: {why}): decode = RAM copy rate, prefill = planner default")
