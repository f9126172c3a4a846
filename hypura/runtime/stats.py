"""Per-token metrics of a run: tok/s, bytes from each tier, stall time and achieved GB/s per link,
with the plan's prediction beside them (what `--stats`, `Llama.stats()` and `hypura bench` show).

Each llama_decode is timed and filed as prefill (a batch of several tokens) or decode (one); the
traffic of every mechanism (layer streamer, expert pager) is summed and differenced around it, so
each phase gets its own bytes and stalls.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from hypura.bindings.ffi import lib
from hypura.runtime.mechanism import TierStats
from hypura.tiers.names import DISK, RAM


@dataclass
class Phase:
    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    stall_s: float = 0.0
    bytes: dict = field(default_factory=dict)  # source tier -> bytes loaded into slots
    timeline: list = field(default_factory=list)
    splits: list = field(default_factory=list)  # the latest call's graph splits: (ms, backend, first node)

    def summary(self) -> dict:
        per_tok = 1 / self.tokens if self.tokens else 0.0
        gbps = {k: v / self.seconds / 1e9 if self.seconds else 0.0 for k, v in self.bytes.items()}
        return {
            "calls": self.calls, "tokens": self.tokens, "seconds": self.seconds,
            "tok_s": self.tokens / self.seconds if self.seconds else 0.0,
            "stall_ms_per_token": 1e3 * self.stall_s * per_tok,
            "streamed_bytes_per_token": {k: v * per_tok for k, v in self.bytes.items()},
            # achieved rates, averaged over the phase: RAM-sourced bytes crossed the host->GPU link
            "link_gbps": {"host_to_gpu": gbps.get(RAM, 0.0), "disk": gbps.get(DISK, 0.0)},
            "last_call_timeline_ms": self.timeline,
            "last_call_splits_ms": self.splits,
        }


def gpu_free() -> int | None:
    """Free memory of this machine's first GPU now (None without one): differenced around a load, what it took."""
    from hypura.profile.devices import local_gpus

    gpus = local_gpus()
    return gpus[0].mem_free if gpus else None


def _vm_hwm() -> int | None:
    """This process's peak RSS (Linux: VmHWM). Not ru_maxrss, which Linux carries across fork and exec: a
    bench started from a large process reported that process's peak as its own."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_now(gpu_free_at_start: int | None) -> dict:
    """Process memory against what the plan budgets: RSS now and at peak; GPU memory taken since start
    (device-wide free memory, so other processes' use counts too)."""
    import resource

    import psutil

    free = gpu_free() if gpu_free_at_start is not None else None
    peak = _vm_hwm()
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # KiB
    rss = psutil.Process().memory_info().rss
    # Linux folds the current RSS into the high-water mark lazily (when pages are unmapped, at exit): the
    # mark read now can lag the RSS by the pages faulted in since
    return {"rss": rss, "rss_peak": max(peak, rss),
            "gpu_used": gpu_free_at_start - free if free is not None else None}


class RunStats:
    def __init__(self, mechanisms: list, streamer=None, plan=None, gpu_free_at_start: int | None = None):
        """mechanisms: every decode-time Mechanism, whose traffic makes the per-token figures; streamer: the
        layer streamer (its hook timeline and graph splits), or None."""
        self.mechanisms, self.streamer, self.plan, self.gpu_free_at_start = mechanisms, streamer, plan, gpu_free_at_start
        self.prefill, self.decode = Phase(), Phase()

    def traffic(self) -> TierStats:
        total = TierStats()
        for m in self.mechanisms:
            total.add_traffic(m.traffic)
        return total

    @contextlib.contextmanager
    def timed(self, n_tokens: int, decode: bool | None = None):
        """Time the body (one llama_decode), filed as decode (one new token per sequence) or prefill; by
        default a batch of one token is decode."""
        s = self.streamer
        before = self.traffic() if s else None
        if s:
            s.timeline.clear()
            s.split_marks(0)  # drop what an earlier call left
        # a C call releases the GIL (another thread may take it till its next wait): only where split marks need it
        t0_us = lib().ggml_time_us() if s else 0
        t0 = time.perf_counter()
        yield
        dt = time.perf_counter() - t0
        phase = self.decode if (n_tokens == 1 if decode is None else decode) else self.prefill
        if s:  # the hooks of the latest call, in ms from its start: where a token's time goes
            phase.timeline = [(kind, layer, round(1e3 * (t - t0), 3)) for kind, layer, t in s.timeline]
            phase.timeline.append(("end", -1, round(1e3 * dt, 3)))
            phase.splits = s.split_marks(t0_us)
        phase.calls, phase.tokens, phase.seconds = phase.calls + 1, phase.tokens + n_tokens, phase.seconds + dt
        if s:
            after = self.traffic()
            phase.stall_s += after.stall_s - before.stall_s
            for k, v in after.bytes.items():
                phase.bytes[k] = phase.bytes.get(k, 0) + v - before.bytes.get(k, 0)

    def reset(self) -> None:
        self.prefill, self.decode = Phase(), Phase()

    def summary(self) -> dict:
        out = {"prefill": self.prefill.summary(), "decode": self.decode.summary()}
        if self.streamer is not None:
            out["stream"] = self.traffic().traffic_dict()
        out["predicted"] = _predicted(self.plan)
        out["memory"] = memory_now(self.gpu_free_at_start)
        if self.plan is not None:
            out["memory"]["budget"] = {t: self.plan.memory[t]["budget"] for t in ("gpu", "ram")}
        return out


def _predicted(plan) -> Optional[dict]:
    if plan is None:
        return None
    pr = plan.prediction
    return {"decode_tok_s": pr.decode_tok_s, "decode_limit": pr.decode_limit, "prefill_tok_s": pr.prefill_tok_s,
            "prefill_limit": pr.prefill_limit, "bytes_per_token": dict(pr.bytes_per_token),
            "link_gbps": pr.gbps()}


def describe(summary: dict) -> list[str]:
    """Lines for `hypura-cli --stats` and `hypura bench`: per phase tok/s, streamed GB per token by
    source, stall and achieved link rates, then the plan's prediction."""
    lines = []
    for name in ("prefill", "decode"):
        ph = summary[name]
        if not ph["tokens"]:
            continue
        streamed = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in ph["streamed_bytes_per_token"].items()) or "none"
        links = ", ".join(f"{k} {v:.1f} GB/s" for k, v in ph["link_gbps"].items() if v) or "-"
        lines.append(f"{name}: {ph['tok_s']:.2f} tok/s over {ph['tokens']} tokens; streamed per token: {streamed}; "
                     f"stall {ph['stall_ms_per_token']:.1f} ms/token; links {links}")
    ex = summary.get("experts")
    if ex and ex["accesses"]:
        n = max(summary["decode"]["tokens"], 1)
        hits = ", ".join(f"{t} {r:.3f}" for t, r in sorted(ex["hit_rate"].items()))
        pf = ex["prefetch"]
        lines.append(f"experts: {ex['slots_per_layer']} slots x {ex['layers']} layers ({ex['policy']}); hit rate {hits}; "
                     f"prefetch {pf['issued']} issued: {pf['used']} used ({pf['late']} late), {pf['wasted']} wasted, "
                     f"precision {pf['precision']:.2f}, recall {pf['recall']:.2f}; loaded per decode token "
                     f"{sum(ex['loaded_bytes'].values()) / n / 1e6:.1f} MB; stall {1e3 * ex['stall_s'] / n:.2f} ms, "
                     f"router hooks {1e3 * ex['hook_s'] / n:.2f} ms per token")
    pg = summary.get("expert_paging")
    if pg and pg["accesses"]:
        total = sum(pg["served"].values())
        served = ", ".join(f"{t} {pg['served'].get(t, 0) / total:.3f}" for t in ("gpu", "ram", "disk"))
        lines.append(f"experts served (all MoE layers' selections): {served}")
        lines.append(f"disk experts: {pg['accesses']} accesses, hit rate {pg['hit_rate']:.3f} in RAM; {pg['reads']} read "
                     f"({pg['bytes'] / 1e9:.2f} GB, {pg['read_gbps_in_stall']:.2f} GB/s while decode waited), resident "
                     f"at most {pg['resident_peak'] / 2**20:.0f} MiB (budget now {pg['budget'] / 2**20:.0f} MiB)")
    mem = summary.get("memory")
    if mem:
        gpu = f", GPU taken {mem['gpu_used'] / 2**30:.2f} GiB" if mem.get("gpu_used") is not None else ""
        budget = mem.get("budget")
        lines.append(f"memory: RSS peak {mem['rss_peak'] / 2**30:.2f} GiB{gpu}"
                     + (f" (budgets: ram {budget['ram'] / 2**30:.2f}, gpu {budget['gpu'] / 2**30:.2f} GiB)"
                        if budget else ""))
    pr = summary.get("predicted")
    if pr:
        lines.append(f"plan predicts decode {pr['decode_tok_s']:.2f} tok/s ({pr['decode_limit']}), "
                     f"prefill {pr['prefill_tok_s']:.0f} tok/s ({pr['prefill_limit']})")
    return lines
