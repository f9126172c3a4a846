"""`hypura bench`'s measurement, llama-bench style: prefill of p tokens and decode of n tokens
from an empty context, random tokens, after a warm-up, r times; medians and spread, beside the
plan's prediction and the bound from measured rates."""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Optional

from hypura.errors import HypuraError
from hypura.plan import Plan


@dataclass(frozen=True)
class BenchSettings:
    n_prompt: int = 512
    n_gen: int = 128
    repeats: int = 3
    n_threads: int = 0  # 0: physical cores
    seed: int = 0


def spread(values: list[float]) -> dict:
    if not values:
        return {}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def bound(plan: Optional[Plan]) -> Optional[dict]:
    """tok/s if every path ran at its measured rate and overlapped perfectly, from the plan's bytes
    per token: CPU-computed and PCIe-streamed bytes share one budget (they run at once), so the
    hybrid term is their sum over the sum of both rates; disk and GPU reads bound on their own."""
    if plan is None:
        return None
    r, b = plan.rates, plan.prediction.bytes_per_token
    hybrid = (b.get("cpu", 0) + b.get("link", 0)) / (r.cpu_read + (r.link or 0))
    terms = {"hybrid cpu+link": hybrid, "disk": b.get("disk", 0) / r.disk_read,
             "gpu": b.get("gpu", 0) / r.gpu_read if r.gpu_read else 0.0}
    limit = max(terms, key=terms.get)
    return {"decode_tok_s": 1 / terms[limit] if terms[limit] else float("inf"), "limit": limit,
            "seconds_per_token": terms}


def run_bench(llm, plan: Optional[Plan], s: BenchSettings, progress=lambda msg: None) -> dict:
    rng = random.Random(s.seed)

    def decode_tokens(toks: list[int]) -> None:
        if not llm.decode_tokens(toks):
            raise HypuraError(f"llama_decode failed on a batch of {len(toks)} tokens")

    vocab = llm.n_vocab()
    tokens = [rng.randrange(vocab) for _ in range(max(s.n_prompt, s.n_gen, 1))]

    def prefill() -> float:
        llm.clear_memory()
        t0 = time.perf_counter()
        decode_tokens(tokens[: s.n_prompt])
        return s.n_prompt / (time.perf_counter() - t0)

    def decode() -> float:
        llm.clear_memory()
        t0 = time.perf_counter()
        for tok in tokens[: s.n_gen]:
            decode_tokens([tok])
        return s.n_gen / (time.perf_counter() - t0)

    progress("warm-up")
    llm.clear_memory()
    for tok in tokens[:2]:
        decode_tokens([tok])
    if s.n_prompt:
        decode_tokens(tokens[2: 2 + min(s.n_prompt, 32)])
    pp, tg = [], []
    llm.stats(reset=True)
    for i in range(s.repeats):
        if s.n_prompt:
            pp.append(prefill())
            progress(f"run {i + 1}/{s.repeats}: prefill {pp[-1]:.1f} tok/s")
        if s.n_gen:
            tg.append(decode())
            progress(f"run {i + 1}/{s.repeats}: decode {tg[-1]:.2f} tok/s")
    out = {"settings": s.__dict__, "prefill_tok_s": spread(pp), "decode_tok_s": spread(tg),
           "stats": llm.stats(), "bound": bound(plan)}
    if plan is not None and tg:
        out["bound_ratio"] = statistics.median(tg) / out["bound"]["decode_tok_s"]
        out["predicted_ratio"] = statistics.median(tg) / plan.prediction.decode_tok_s
    return out
