"""`hypura bench`'s measurement, llama-bench style: prefill of p tokens and decode of n tokens
from an empty context, random tokens, after a warm-up, r times; medians and spread, beside the
plan's prediction and the bound from measured rates. Where experts page from disk, the disk is probed
with the same reads before and after the runs (runtime/disk_probe.py), and the bound is given again at
that rate."""

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
    n_threads: int = 0  # the run's threads, as reported (the Llama was made with them)
    seed: int = 0


def spread(values: list[float]) -> dict:
    if not values:
        return {}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


PROBE_S = 1.0  # each disk probe beside the runs: ~1-2 GB at NVMe rates, many bursts


def bound(plan: Optional[Plan], disk_bytes: Optional[float] = None,
          disk_rate: Optional[float] = None) -> Optional[dict]:
    """tok/s if every path ran at its measured rate and overlapped perfectly, from the plan's bytes
    per token: CPU-computed and PCIe-streamed bytes share one budget (they run at once), so the
    hybrid term is their sum over the sum of both rates; disk and GPU reads bound on their own.
    disk_bytes: a decode token's measured disk bytes, in place of the plan's (experts read as routers
    select them: the bound at the measured hit rate), at the profile's rate for random expert reads.
    disk_rate: the disk's bytes/s as probed beside the run, in place of the profile's."""
    if plan is None:
        return None
    r, b = plan.rates, plan.prediction.bytes_per_token
    hybrid = (b.get("cpu", 0) + b.get("link", 0)) / (r.cpu_read + (r.link or 0))
    # measured bytes are experts read by selection (random reads); the plan's mix sequential and random ones
    disk, experts = (b.get("disk", 0), plan.traffic.expert_disk_bytes) if disk_bytes is None else (disk_bytes,) * 2
    disk_s = disk / disk_rate if disk_rate else r.disk_seconds(disk, experts)
    terms = {"hybrid cpu+link": hybrid, "disk": disk_s,
             "gpu": b.get("gpu", 0) / r.gpu_read if r.gpu_read else 0.0}
    limit = max(terms, key=terms.get)
    seconds = terms[limit]
    if limit == "disk" and disk_bytes is not None:
        limit = "disk, at the measured hit rate"
    return {"decode_tok_s": 1 / seconds if seconds else float("inf"), "limit": limit, "seconds_per_token": terms}


def expert_cache_bound(header, rates, experts: dict) -> Optional[dict]:
    """For a run with expert caches: tok/s if a decode token only read its weights from GPU memory (the
    non-expert tensors and k experts a MoE layer) and loaded the experts it missed, as measured, over
    PCIe, both at the profile's rates, one after the other (a layer's misses load before its experts
    compute)."""
    from hypura.runtime.moe.expert_streaming import EXPERT_NAMES

    if not experts or not rates.gpu_read or not rates.link:
        return None
    k = int(header.get("expert_used_count"))
    read = sum(t.nbytes * (k / t.shape[2] if t.name.endswith(EXPERT_NAMES) else 1)
               for t in header.tensors if t.name != "token_embd.weight")
    tokens = experts["accesses"] / (k * experts["layers"])  # the decode tokens the caches served
    loaded = sum(experts["loaded_bytes"].values()) / tokens if tokens else 0.0
    terms = {"gpu": read / rates.gpu_read, "link": loaded / rates.link}
    return {"decode_tok_s": 1 / sum(terms.values()), "limit": "expert cache at the measured hit rate",
            "seconds_per_token": terms}


def resident_bound(header, rates, on_gpu: bool) -> dict:
    """A run without a plan (llama.cpp's placement, every weight resident): tok/s if decode read its weights
    (the input embeddings but one row aside; k of E experts a MoE layer) at the profile's rate."""
    from hypura.runtime.moe.expert_streaming import EXPERT_NAMES

    k = int(header.get("expert_used_count", 0) or 0)
    tied = not any(t.name == "output.weight" for t in header.tensors)  # token_embd is the output matrix too
    read = sum(t.nbytes * (k / t.shape[2] if k and t.name.endswith(EXPERT_NAMES) else 1)
               for t in header.tensors if t.name != "token_embd.weight" or tied)
    path, rate = ("gpu", rates.gpu_read) if on_gpu and rates.gpu_read else ("cpu", rates.cpu_read)
    return {"decode_tok_s": rate / read if read else float("inf"), "limit": f"{path}, resident weights",
            "seconds_per_token": {path: read / rate}}


def honest(b: Optional[dict], measured_tok_s: Optional[float]) -> Optional[dict]:
    """A bound is never beaten: where the run beat the one from the profile's rates, those rates were low
    (a quick profile's defaults, or a machine faster now), and the measured speed stands as the bound."""
    if b is None or not measured_tok_s or measured_tok_s <= b["decode_tok_s"]:
        return b
    return dict(b, decode_tok_s=measured_tok_s, profile_bound_tok_s=b["decode_tok_s"],
                limit=f"{b['limit']}; the profile's rates gave {b['decode_tok_s']:.2f}, beaten by this run: "
                      "`hypura profile --force` measures them again")


def run_bench(llm, plan: Optional[Plan], s: BenchSettings, progress=lambda msg: None, rates=None) -> dict:
    """rates: the machine's (hypura.plan.Rates), for a run's bound without a plan (expert caches)."""
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
    before = llm.probe_disk(PROBE_S) if s.n_gen else None  # paged experts: what the disk gives their reads now
    if before:
        progress(f"disk probe: {before['gbps']:.2f} GB/s for bursts of {before['experts_per_burst']} expert(s)")
    pp, tg = [], []
    llm.stats(reset=True)
    for i in range(s.repeats):
        if s.n_prompt:
            pp.append(prefill())
            progress(f"run {i + 1}/{s.repeats}: prefill {pp[-1]:.1f} tok/s")
        if s.n_gen:
            tg.append(decode())
            progress(f"run {i + 1}/{s.repeats}: decode {tg[-1]:.2f} tok/s")
    stats = llm.stats()
    paged = stats.get("expert_paging") and tg  # the disk bytes depend on routing: measured, not the plan's
    disk_bytes = stats["decode"]["streamed_bytes_per_token"].get("disk", 0.0) if paged else None
    b = bound(plan, disk_bytes) if plan is not None and not plan.expert_slots else None
    if b is None and rates is not None:
        b = expert_cache_bound(llm.header, rates, stats.get("experts"))
    if b is None and plan is None and rates is not None:
        b = resident_bound(llm.header, rates, on_gpu=llm.model_params.n_gpu_layers != 0 and rates.has_gpu)
    b = honest(b, max(tg) if tg else None)
    out = {"settings": s.__dict__, "prefill_tok_s": spread(pp), "decode_tok_s": spread(tg),
           "stats": stats, "bound": b}
    if b is not None and tg:
        out["bound_ratio"] = statistics.median(tg) / b["decode_tok_s"]
    if before and disk_bytes is not None and plan is not None:  # again, at decode's burst size: the drift shows
        after = llm.probe_disk(PROBE_S)
        rate = (before["gbps"] + after["gbps"]) / 2 * 1e9
        out["disk_probe"] = {"before": before, "after": after}
        out["bound_now"] = honest(bound(plan, disk_bytes, rate), max(tg))
        out["bound_now_ratio"] = statistics.median(tg) / out["bound_now"]["decode_tok_s"]
    if plan is not None and tg:
        out["predicted_ratio"] = statistics.median(tg) / plan.prediction.decode_tok_s
    return out
