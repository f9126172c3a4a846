"""The bound beside every measurement: tok/s if a decode step of b tokens cost only its weight bytes, each
path at its measured rate, all paths overlapping perfectly.

Bytes a step reads: every weight once whatever the batch (the input embeddings only where they are the output
matrix too: get_rows reads b rows), and of a stacked expert tensor the experts any of the b tokens select,
1 - (1 - k/E)^b of them under uniform routing (skewed real routing touches fewer). They go by the plan's tiers
and compute devices (without a plan, llama.cpp's placement: every weight resident, on the GPU or in RAM) and
each path is timed on its own: CPU reads, link copies, disk reads, GPU reads (a shared CPU+link budget would
credit the CPU's rate to bytes only the link can move). Left out: KV reads, compute, fixed per-layer costs,
and an expert cache's hits (expert_cache_bound covers a run with one). The paths, the experts a step touches
and each path's seconds are the cost model's (hypura.plan.cost: PATHS, step_probability, bytes_seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hypura.plan.cost import PATHS, bytes_seconds, step_probability


@dataclass(frozen=True)
class _Resident:
    """A header tensor as llama.cpp holds it without a plan: resident, on the GPU or in RAM."""

    name: str
    nbytes: int
    tier: str
    compute: str
    experts: tuple = ()
    expert_compute: tuple = ()


def _resident(t, on_gpu: bool) -> _Resident:
    from hypura.runtime.moe.expert_streaming import EXPERT_NAMES

    tier, dev = ("gpu", "gpu") if on_gpu else ("ram", "cpu")
    n = t.shape[2] if t.name.endswith(EXPERT_NAMES) and len(t.shape) == 3 else 0  # stacked experts [.., .., E]
    return _Resident(t.name, t.nbytes, tier, dev, (tier,) * n, (dev,) * n)


def bound(header, plan, rates, b: int = 1, on_gpu: Optional[bool] = None,
          disk_bytes: Optional[float] = None, disk_rate: Optional[float] = None) -> Optional[dict]:
    """Aggregate decode tok/s of steps of b tokens (module docstring); None where it is not known.

    plan: the run's (its rates); None: llama.cpp's placement at `rates`, every weight on the GPU (on_gpu) or
    in RAM (not on_gpu); on_gpu None: a split llama.cpp chose (-ngl N), not known here.
    disk_bytes: a step's disk bytes as measured (experts read as the routers chose them), in place of the
    uniform estimate; disk_rate: the disk's bytes/s as probed beside the run, in place of the profile's."""
    rates = plan.rates if plan is not None else rates
    if rates is None or (plan is None and on_gpu is None):
        return None
    if plan is None and on_gpu and not rates.gpu_read:
        on_gpu = False
    k = int(header.get("expert_used_count", 0) or 0)
    tied = not any(t.name == "output.weight" for t in header.tensors)  # token_embd is the output matrix too
    placed = plan.tensors if plan is not None else [_resident(t, on_gpu) for t in header.tensors]
    paths = dict.fromkeys(PATHS, 0.0)
    expert_disk = 0.0
    for t in placed:
        if t.name == "token_embd.weight" and not tied:
            continue  # get_rows of b rows, not a pass over the tensor
        units = [(t.tier, plan.compute_at(t, b) if plan is not None else t.compute, t.nbytes)]
        whole = 0.0  # bytes that cross the link whatever the step reads: stacks streamed whole (plan.dual)
        if t.experts:
            n = len(t.experts)
            touched = step_probability(min(k, n) / n, b)
            dual = plan is not None and t.name in plan.dual
            computes = (units[0][1],) * n if dual else (t.expert_compute or (t.compute,) * n)
            units = [(tier, dev, t.nbytes / n * touched) for tier, dev in zip(t.experts, computes)]
            whole = t.nbytes / n if dual else 0.0
        for tier, dev, nbytes in units:
            paths[dev] += nbytes
            if tier == "disk":
                paths["disk"] += nbytes
                expert_disk += nbytes if t.experts else 0.0
            if dev == "gpu" and (tier == "ram" or (tier == "disk" and not rates.unified)):
                paths["link"] += whole or nbytes
    limit_note = ""
    if disk_bytes is not None:
        paths["disk"], expert_disk, limit_note = disk_bytes * b, disk_bytes * b, ", at the measured hit rate"
    terms = bytes_seconds(paths, rates, expert_disk, plan is not None and plan.traffic.host_pinned)
    if disk_rate:
        terms["disk"] = paths["disk"] / disk_rate
    limit = max(terms, key=terms.get)
    step_s = terms[limit]
    return {"decode_tok_s": b / step_s if step_s else float("inf"),
            "limit": limit + (limit_note if limit == "disk" else ""), "placement": "plan" if plan else "resident",
            "step_seconds": terms, "step_bytes": paths}


def run_bound(llm, plan, rates, b: int = 1) -> Optional[dict]:
    """The bound at steps of b tokens of a loaded model (hypura.loaded.LoadedModel): its plan's, else llama.cpp's
    placement's at `rates` (None without them)."""
    if plan is not None:
        return bound(llm.header, plan, None, b)
    if rates is None:
        return None
    return bound(llm.header, None, rates, b, on_gpu=llama_on_gpu(llm.model_params.n_gpu_layers, llm.header.n_layer,
                                                                  rates.has_gpu))


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


def honest(b: Optional[dict], measured_tok_s: Optional[float]) -> Optional[dict]:
    """A bound is never beaten: where the run beat the one from the profile's rates, those rates were low
    (a quick profile's defaults, or a machine faster now), and the measured speed stands as the bound."""
    if b is None or not measured_tok_s or measured_tok_s <= b["decode_tok_s"]:
        return b
    return dict(b, decode_tok_s=measured_tok_s, profile_bound_tok_s=b["decode_tok_s"],
                limit=f"{b['limit']}; the profile's rates gave {b['decode_tok_s']:.2f}, beaten by this run: "
                      "`hypura profile --force` measures them again")


def llama_on_gpu(n_gpu_layers: int, n_layer: int, has_gpu: bool) -> Optional[bool]:
    """Where llama.cpp's own placement keeps the weights: all on the GPU, all in RAM, or a split (None)."""
    if not has_gpu or n_gpu_layers == 0:
        return False
    return True if n_gpu_layers < 0 or n_gpu_layers > n_layer else None
