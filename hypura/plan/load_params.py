"""llama.cpp's parameters for one load, from the decision: the plan (or llama.cpp's placement), the
request and the machine, with no I/O. What the runtime and the loader apply, and nothing they decide:

    decided                          from
    n_gpu_layers, offload_kqv        the plan's placement and KV cache tier (the hooks keep CPU weights on the host)
    op_offload                       off where hooks fill host weights, or where the plan's cost model assumed it off
    no_host, use_extra_bufts         plain host buffers where the plan's CPU weights are read, paged, pinned or streamed
    n_ubatch, n_batch                the plan's micro-batch where a larger one pays, or the smaller one a CPU
                                     plan's staging holds where it pages experts (microbatch.py)
    n_outputs_max                    with it, the logits rows the caller reads a step (Ask.n_outputs)
    n_seq_max, kv_unified            `parallel` sequences (and spare ids) in one unified KV cache
    n_threads, n_threads_batch       the cores, less those the disk's readers need

What the caller gave stands: -ub, -t/-tb, -ngl (no plan), and fields of param_overrides; a given field that
contradicts what the plan needs is refused where it is applied (runtime/params.py), with the `needed` reason.
The load mode is the one field left to the runtime: it follows the model file's residency in the page cache at
load time (runtime/load_reads.py).
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, field
from typing import Mapping, Optional

from hypura.plan import knobs
from hypura.plan.ask import Ask
from hypura.plan.plan import Plan
from hypura.plan.pools import paged_by_expert, streamed_through_host
from hypura.tiers.names import GPU

LOAD_MODE_NONE = 0  # llama.h's LLAMA_LOAD_MODE_NONE (read, not mapped); the planner runs without the library

# a quarter of the cores is left to the pager's threads, on machines this large (on 2 cores a fault-in thread
# gained nothing)
SPARE_CORES_MIN = 8


@dataclass(frozen=True)
class Host:
    """The facts of the machine the parameters follow (fixed, not measured): a GPU llama.cpp places on, the cores."""

    gpu: bool
    cores: int  # physical
    cpus: int  # logical (llama-cpp-python's count)

    @classmethod
    def here(cls) -> Host:
        from hypura.profile.devices import has_gpu
        from hypura.profile.host import cores

        return cls(has_gpu(), cores()[0], multiprocessing.cpu_count())

    @classmethod
    def profiled(cls, profile) -> Host:
        """The GPU a machine profile records (another machine's plan: `inspect --profile`), this one's cores: asks
        nothing of llama.cpp, so a plan is made before the library is built."""
        from hypura.profile.host import cores

        return cls(getattr(profile, "gpu", None) is not None, cores()[0], multiprocessing.cpu_count())


@dataclass(frozen=True)
class LoadParams:
    """llama.cpp's model and context parameters and thread counts for one load. None: not Hypura's to set
    (llama-cpp-python's keyword, or the caller's param_overrides, stands)."""

    n_ctx: int  # 0: the training context
    n_batch: int
    n_ubatch: int
    plan_batch: bool  # n_ubatch is the plan's: set over the caller's context fields too (with n_batch)
    n_threads: int
    n_threads_batch: int
    n_gpu_layers: Optional[int] = None  # model_params: every layer's work on the GPU (n_layer + 1) or none (0)
    no_host: Optional[bool] = None
    use_extra_bufts: Optional[bool] = None
    load_mode: Optional[int] = None
    offload_kqv: Optional[bool] = None  # context_params
    op_offload: Optional[bool] = None
    n_seq_max: Optional[int] = None
    kv_unified: Optional[bool] = None
    n_outputs_max: Optional[int] = None  # a grown micro-batch's logits rows (0 or unset: every token)
    needed: Mapping[str, str] = field(default_factory=dict)  # field -> why the plan needs its value

    def fields(self) -> dict:
        """{"model_params": {...}, "context_params": {...}}: what Hypura sets over llama-cpp-python's params."""
        out = {"model_params": {}, "context_params": {}}
        for name in _MODEL + _CONTEXT + (("n_ubatch", "n_batch") if self.plan_batch else ()):
            value = getattr(self, name)
            if value is not None:
                out["model_params" if name in _MODEL else "context_params"][name] = value
        return out

    def keywords(self) -> dict:
        """llama-cpp-python's keywords these set (the context's size, its batch and the threads)."""
        return {name: getattr(self, name) for name in ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch")}


_MODEL = ("n_gpu_layers", "no_host", "use_extra_bufts", "load_mode")
_CONTEXT = ("offload_kqv", "op_offload", "n_seq_max", "kv_unified", "n_outputs_max")


def load_params(plan: Optional[Plan], n_ctx: int, ask: Ask, host: Host) -> LoadParams:
    """The parameters of a load of `plan` (None: llama.cpp places the model) at context `n_ctx` (module
    docstring)."""
    given = {name: dict(fields) for name, fields in (ask.param_overrides or {}).items()}
    model, context = given.get("model_params", {}), given.get("context_params", {})
    needed: dict[str, str] = {}
    out: dict = {}

    def need(why: str, **fields) -> None:
        out.update(fields)
        needed.update(dict.fromkeys(fields, why))

    paged = plan is not None and any(paged_by_expert(t) for t in plan.tensors)
    cache = ask.expert_cache is not None or bool(plan is not None and plan.expert_slots)
    if plan is not None:
        _plan_needs(plan, paged, cache, host, need)
        if not plan.traffic.op_offload and "op_offload" not in context and "op_offload" not in out:
            # the plan was made for many sequences without llama.cpp's op offload (plan/cost.py)
            out["op_offload"] = False
    if cache:
        if host.gpu:  # read, not mapped: with mmap, llama.cpp maps what would be pinned (copies 6x slower)
            for key, value in (("n_gpu_layers", -1), ("load_mode", LOAD_MODE_NONE)):
                if key not in model and key not in out:
                    out[key] = value
        else:
            need("expert caches copy plain slices", use_extra_bufts=False)
    n_ubatch, n_batch = _batches(plan, ask)
    if n_ubatch > ask.n_ubatch and ask.n_outputs and "n_outputs_max" not in context:
        out["n_outputs_max"] = ask.n_outputs  # the grown micro-batch's logits: only the rows the caller reads
    several = ask.parallel + ask.spare_seqs > 1
    if several:  # one unified KV cache: sequences copy a shared prefix's cells instead of recomputing it
        unified = context.get("kv_unified", True)
        out["kv_unified"] = None if "kv_unified" in context else True
        out["n_seq_max"] = None if "n_seq_max" in context else ask.parallel + (ask.spare_seqs if unified else 0)
    n_threads, n_threads_batch = _threads(plan, ask, host, paged, several)
    return LoadParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, plan_batch=n_ubatch != ask.n_ubatch,
                      n_threads=n_threads, n_threads_batch=n_threads_batch, needed=needed, **out)


def _plan_needs(plan: Plan, paged: bool, cache: bool, host: Host, need) -> None:
    """What a plan needs of llama.cpp, whatever the caller gave: -ngl and --no-kv-offload as its placement says
    (the hooks keep CPU-computed weights in host memory), and the buffers its hooks fill."""
    uses_gpu = any(t.tier == GPU or t.compute == GPU for t in plan.tensors)
    through_host = streamed_through_host(plan, host.gpu)
    need("the plan's placement", n_gpu_layers=plan.n_layer + 1 if uses_gpu else 0)
    need("the plan's KV cache tier", offload_kqv=uses_gpu and plan.kv_tier == GPU)
    if paged:
        # slices are written in ggml's plain layout: no repacking CPU buffer types; and no pinned host
        # buffers, which are resident whole (an H200 run kept all 6.4 GiB of disk experts in RSS)
        need("experts paged from disk", use_extra_bufts=False, no_host=True)
    if host.gpu and (paged or through_host):
        # these CPU weights are valid only while their layer runs (hooks fill them): op offload would copy
        # them to the GPU for a prompt batch when the graph split starts, before they are filled
        need("host weights filled by hooks", op_offload=False)
    pinned = plan.traffic.host_pinned and not paged
    if uses_gpu and not (plan.expert_slots or cache or pinned):
        # read, CPU weights would take the GPU's pinned host buffers, which come before the repacking CPU ones:
        # plain memory, as the profile measured the CPU's rate (an expert cache's experts stay pinned)
        need("CPU weights in plain memory", no_host=True)
    if pinned:
        # the hooks home the plan's pinned CPU weights in the mapped file (runtime/plan_policy.py), in ggml's plain
        # layout (the cost model reads every CPU weight at that one rate); their deferred buffers are never touched,
        # and must not be the GPU's pinned host buffers, which cudaHostAlloc pins whole (2.7 GB/s); an expert cache's
        # experts are those buffers
        need("CPU weights held pinned", use_extra_bufts=False, **({} if plan.expert_slots or cache else {"no_host": True}))
    if through_host:
        # a repacking CPU buffer converts every streamed tensor at every load, on the loader's core, and each
        # token's decode waits for those conversions
        need("host-pool tensors streamed each pass", use_extra_bufts=False)


def _batches(plan: Optional[Plan], ask: Ask) -> tuple[int, int]:
    """(n_ubatch, n_batch): the plan's micro-batch where a larger one pays (microbatch.py), with a batch at least
    as large (llama.cpp splits a batch into micro-batches, never the other way); a micro-batch the caller gave
    stands, but one equal to llama.cpp's default is no choice (the CLI passes every flag). A CPU plan may be made
    at a smaller one than the caller's, which its staging and compute buffer fit (microbatch.within_staging)."""
    if plan is not None and plan.n_ubatch < ask.n_ubatch and not plan.rates.has_gpu:
        return plan.n_ubatch, ask.n_batch
    if plan is None or plan.n_ubatch <= knobs.N_UBATCH or ask.n_ubatch != knobs.N_UBATCH:
        return ask.n_ubatch, ask.n_batch
    return plan.n_ubatch, max(ask.n_batch, plan.n_ubatch)


def _threads(plan: Optional[Plan], ask: Ask, host: Host, paged: bool, several: bool) -> tuple[int, int]:
    """llama.cpp's CPU threads: unset, its default (physical cores), less a quarter when experts page from disk,
    less one on a small machine whose decode waits on dense layers read from disk (llama_threads); the batch's,
    unset, as n_threads where Hypura chose that, experts page, or several sequences decode together (llama-server's
    -tb default: -t); else llama-cpp-python's defaults (half the logical CPUs, and all of them for batches)."""
    n_threads, n_threads_batch = ask.n_threads or None, ask.n_threads_batch or None
    chosen = n_threads is None
    waits = chosen and waits_on_disk_layers(plan, host.cores, paged)
    if chosen:
        n_threads = llama_threads(host.cores, paged, waits)
    if n_threads_batch is None and (chosen or paged or several):
        # a prompt's micro-batch that the plan predicts compute-bound takes the reader's core back
        compute_bound = waits and plan.prediction.prefill_limit == "compute"
        n_threads_batch = llama_threads(host.cores, False) if compute_bound else n_threads
    return n_threads or max(host.cpus // 2, 1), n_threads_batch or host.cpus


def waits_on_disk_layers(plan: Optional[Plan], cores: int, paged: bool) -> bool:
    """The plan's decode waits on dense layers read from disk, and would with a core fewer computing."""
    if plan is None or paged or plan.prediction.decode_limit != "disk":
        return False
    s = plan.prediction.seconds
    return cores > 1 and s.get("cpu", 0.0) * cores / (cores - 1) + s.get("gpu", 0.0) < s.get("disk", 0.0)


def spare_cores(n: int) -> int:
    """Of n cores, those left to the pager's threads (readers, fault-in) while llama.cpp computes."""
    return n // 4 if n >= SPARE_CORES_MIN else 0


def llama_threads(physical: int, paged: bool, waits_on_disk_layers: bool = False) -> int:
    """llama.cpp's CPU threads when none are given, on `physical` cores: its own default (physical cores), less the
    spare cores when experts page from disk. libgomp's workers spin for milliseconds after each CPU split; on every
    core, they took the cores the router hook's reads need (H200, paged Qwen-shaped decode: 1.9 tok/s at 16
    threads, 4.4 at 12). Below SPARE_CORES_MIN cores, a decode that waits on dense layers read from disk (and would
    still wait with a core fewer) leaves one to the reader: a 2-core VM streaming 3.1 GB a token of a llama3.1-8b
    shape read 1.1-1.3 GB/s beside 2 threads, 1.5-1.7 beside 1 (decode 0.38 and 0.49 tok/s, medians of
    alternating runs)."""
    if paged:
        return physical - spare_cores(physical)
    return physical - 1 if waits_on_disk_layers and 1 < physical < SPARE_CORES_MIN else physical


__all__ = ["Host", "LoadParams", "llama_threads", "load_params", "spare_cores"]
