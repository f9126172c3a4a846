"""One sequence, llama-bench style: prefill of p tokens (for each p of a sweep: a pass of p tokens is what a
speculative decoder's verification costs) and decode of n tokens (for each n of a sweep) from an empty
context, random tokens, after a warm-up, r times; medians and spread, beside the plan's prediction and the bound at one token a step
(bound.py). Where experts page from disk, the disk is probed with the same reads before and after the runs
(runtime/moe/disk_probe.py), and the bound is given again at that rate."""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Optional

from hypura.errors import HypuraError
from hypura.plan import Plan
from hypura.speed.bound import bound, expert_cache_bound, honest, run_bound

PROBE_S = 1.0  # each disk probe beside the runs: ~1-2 GB at NVMe rates, many bursts
WARMUP_PROMPT = 32  # tokens of the warm-up's prompt pass (at most)


@dataclass(frozen=True)
class BenchSettings:
    n_prompt: tuple[int, ...] = (512,)  # -p: a prefill run for each (0: none)
    n_gen: tuple[int, ...] = (128,)  # -n: a decode run for each (0: none)
    repeats: int = 3
    n_threads: int = 0  # the run's threads, as reported (the Llama was made with them)
    seed: int = 0

    def __post_init__(self):
        for name in ("n_prompt", "n_gen"):
            if isinstance(getattr(self, name), int):
                object.__setattr__(self, name, (getattr(self, name),))
        if not self.n_prompt or not self.n_gen or min(self.n_prompt + self.n_gen) < 0 or self.repeats < 1:
            raise HypuraError("bench: want -p >= 0, -n >= 0 and -r >= 1")

    @property
    def n_ctx(self) -> int:
        """The context the runs need (and a warm-up's), as the bench has always sized it."""
        return max(256, max(self.n_prompt) + max(self.n_gen) + 64)


def spread(values: list[float]) -> dict:
    if not values:
        return {}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def run_bench(llm, plan: Optional[Plan], s: BenchSettings, progress=lambda msg: None, rates=None) -> dict:
    """rates: the machine's (hypura.plan.Rates), for a run's bound without a plan."""
    rng = random.Random(s.seed)

    def decode_tokens(toks: list[int], decode: bool) -> None:
        if not llm.decode_tokens(toks, decode):
            raise HypuraError(f"llama_decode failed on a batch of {len(toks)} tokens")

    vocab = llm.n_vocab()
    # the prompts and the decode share one random sequence (a seed's tokens are the same whatever -p and -n)
    tokens = [rng.randrange(vocab) for _ in range(max(max(s.n_prompt), max(s.n_gen), 2 + WARMUP_PROMPT))]

    def prefill(n: int) -> float:
        llm.context.clear()
        t0 = time.perf_counter()
        decode_tokens(tokens[:n], decode=False)
        return time.perf_counter() - t0

    def decode(n: int) -> float:
        llm.context.clear()
        t0 = time.perf_counter()
        for tok in tokens[:n]:
            decode_tokens([tok], decode=True)
        return n / (time.perf_counter() - t0)

    progress("warm-up")
    llm.context.clear()
    for tok in tokens[:2]:
        decode_tokens([tok], decode=True)
    if max(s.n_prompt):
        decode_tokens(tokens[2: 2 + min(max(s.n_prompt), WARMUP_PROMPT)], decode=False)
    before = llm.probe_disk(PROBE_S) if max(s.n_gen) else None  # paged experts: what the disk gives their reads now
    if before:
        progress(f"disk probe: {before['gbps']:.2f} GB/s for bursts of {before['experts_per_burst']} expert(s)")
    passes = {n: [] for n in s.n_prompt if n}
    gens = {n: [] for n in s.n_gen if n}
    llm.stats(reset=True)
    for i in range(s.repeats):
        for n, runs in passes.items():
            runs.append(prefill(n))
            progress(f"run {i + 1}/{s.repeats}: prefill of {n} tokens {n / runs[-1]:.1f} tok/s")
        for n, runs in gens.items():
            runs.append(decode(n))
            progress(f"run {i + 1}/{s.repeats}: decode of {n} tokens {runs[-1]:.2f} tok/s")
    stats = llm.stats()
    sweep = [{"n_prompt": n, "tok_s": spread([n / t for t in runs]), "pass_s": spread(runs)}
             for n, runs in passes.items()]
    gen_sweep = [{"n_gen": n, "tok_s": spread(runs)} for n, runs in gens.items()]
    tg = gens[max(gens)] if gens else []  # the longest decode: the headline, against the bound
    b = _bound(llm, plan, rates, stats, bool(tg))
    b = honest(b, max(tg) if tg else None)
    out = {"settings": {**s.__dict__, "n_prompt": list(s.n_prompt), "n_gen": list(s.n_gen)},
           "prefill_tok_s": sweep[-1]["tok_s"] if sweep else {}, "decode_tok_s": spread(tg),
           "stats": stats, "bound": b}
    if len(sweep) > 1 or len(gen_sweep) > 1:  # llama-bench's rows, one a size
        out["prefill_sweep"], out["decode_sweep"] = sweep, gen_sweep
    if b is not None and tg:
        out["bound_ratio"] = statistics.median(tg) / b["decode_tok_s"]
    paged_disk = _paged_disk_bytes(stats, tg)
    if before and paged_disk is not None and plan is not None:  # again, at decode's burst size: the drift shows
        after = llm.probe_disk(PROBE_S)
        rate = (before["gbps"] + after["gbps"]) / 2 * 1e9
        out["disk_probe"] = {"before": before, "after": after}
        out["bound_now"] = honest(bound(llm.header, plan, None, 1, disk_bytes=paged_disk, disk_rate=rate), max(tg))
        out["bound_now_ratio"] = statistics.median(tg) / out["bound_now"]["decode_tok_s"]
    if plan is not None and tg:
        out["predicted_ratio"] = statistics.median(tg) / plan.prediction.decode_tok_s
    return out


def _paged_disk_bytes(stats: dict, tg: list) -> Optional[float]:
    """Where experts page from disk, a decode token's disk bytes as measured (they depend on routing)."""
    if not (stats.get("expert_paging") and tg):
        return None
    return stats["decode"]["streamed_bytes_per_token"].get("disk", 0.0)


def _bound(llm, plan, rates, stats: dict, decoded: bool) -> Optional[dict]:
    """The bound at one token a step: the plan's (at the measured disk bytes where experts page), an expert
    cache's at its measured hit rate, or llama.cpp's resident placement's."""
    if plan is not None and not plan.expert_slots:
        return bound(llm.header, plan, None, 1, disk_bytes=_paged_disk_bytes(stats, decoded))
    if rates is None:
        return None
    b = expert_cache_bound(llm.header, rates, stats.get("experts"))
    if b is None and plan is None:
        b = run_bound(llm, None, rates, 1)
    return b
