"""`hypura bench`'s run: the model loaded as hypura-cli loads it (the one decision: a plan from budgets or a
file, an expert cache, or the default path), then one sequence (single.py), the batched engine at each
size (batched.py) or speculative decoding beside plain (speculative.py), beside the bound (bound.py); the result as one dict (the JSON) that report.py prints."""

from __future__ import annotations

import dataclasses
import platform
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan.auto import Fit
from hypura.plan.budget import parse_size, rates_for
from hypura.profile.host import cores
from hypura.speed.batched import BatchBenchSettings, run_batch_bench
from hypura.speed.single import BenchSettings, run_bench
from hypura.speed.speculative import SpecBenchSettings, run_spec_bench

if TYPE_CHECKING:
    from hypura.speculative.settings import SpecSettings


@dataclass(frozen=True)
class BenchArgs:
    """`hypura bench`'s flags."""

    model: str
    gpu_mem: Optional[str] = None  # budgets: a plan is made within them
    ram: Optional[str] = None
    plan_file: Optional[str] = None
    n_prompt: tuple[int, ...] = (512,)  # -p; several: a sweep (one sequence only)
    n_gen: tuple[int, ...] = (128,)  # -n; several: a sweep (one sequence only)
    ctx_size: int = 0  # 0: as hypura-cli chooses it (at least fit_ctx and what the runs need)
    fit_ctx: int = 4096
    repetitions: int = 3
    threads: Optional[int] = None
    n_gpu_layers: int = -1
    flash_attn: str = "auto"  # on | off | auto
    profile: Optional[str] = None  # a profile file or bundled example to plan with
    expert_slots: Optional[int] = None  # -1: as many as gpu_mem leaves
    seed: int = 0
    parallel: tuple[int, ...] = ()  # the batched engine at these sequence counts
    spec: Optional["SpecSettings"] = None  # speculative decoding beside plain decode (speculative.py)
    rpc: Optional[str] = None  # llama.cpp RPC servers, host:port,... (docs/devices.md)
    rpc_mem: Optional[tuple[str, ...]] = None  # a budget per RPC device
    split: bool = False  # the layers split over this machine's GPUs (and the RPC servers) and its RAM

    def __post_init__(self):
        if self.plan_file and (self.gpu_mem or self.ram):
            raise HypuraError("give --plan or --gpu-mem/--ram budgets (which make a plan), not both")
        if self.parallel and (len(self.n_prompt) > 1 or len(self.n_gen) > 1):
            raise HypuraError("--parallel takes one -p and one -n (tokens per sequence)")
        if self.expert_slots is not None and (self.plan_file or self.ram):
            raise HypuraError("--expert-slots sizes the GPU cache itself: give --gpu-mem only")
        if self.expert_slots is not None and self.expert_slots < 0 and not self.gpu_mem:
            raise HypuraError("--expert-slots -1 needs --gpu-mem")
        if self.spec is not None and (self.parallel or len(self.n_gen) > 1):
            raise HypuraError("speculative decoding is measured on one sequence, at one -n (no --parallel, no sweep)")


def run(a: BenchArgs, say: Callable[[str], None]) -> dict:
    """Load, measure, close; the result (single.py's or batched.py's, with what the run was)."""
    import llama_cpp

    from hypura.loaded import Ask, load
    from hypura.profile.measure import planning_profile
    from hypura.profile.store import resolve_profile
    from hypura.runtime.moe.expert_streaming import ExpertCacheSettings, slots_for_budget

    header = read_header(a.model)
    # speculation decodes from its own text prompt (speculative.py), not -p random tokens
    single = BenchSettings(a.n_prompt if a.spec is None else (0,), a.n_gen, a.repetitions, 0, a.seed)
    if a.ctx_size and a.ctx_size < single.n_ctx:
        raise HypuraError(f"-c {a.ctx_size} is too small for -p {max(a.n_prompt)} and -n {max(a.n_gen)}: give at least "
                          f"{single.n_ctx}")
    batched = BatchBenchSettings(a.n_prompt[0], a.n_gen[0], a.parallel, a.repetitions, a.seed) if a.parallel else None
    profile = resolve_profile(a.profile) if a.profile else None
    # the bound of a run without a plan: the profile named, else this machine's (measured now if it has none)
    rates = lambda: rates_for(profile or planning_profile(a.model))  # noqa: E731
    cache = None
    if a.expert_slots is not None:
        slots = slots_for_budget(header, parse_size(a.gpu_mem)) if a.expert_slots < 0 else a.expert_slots
        cache = ExpertCacheSettings(slots)
    # the load plans within the budgets (an expert cache sizes itself), with the profile named
    budgets = {"gpu_mem": a.gpu_mem, "ram": a.ram, "profile": profile} if cache is None else {}
    planned = a.plan_file or a.gpu_mem or a.ram
    say(f"loading {a.model} ({'plan' if planned else 'plan or llama.cpp placement by free memory' if cache is None and a.n_gpu_layers in (0, -1) else f'-ngl {a.n_gpu_layers}'}) ...")
    fa = {"on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
          "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO}[a.flash_attn]
    context = {"flash_attn_type": fa}
    if a.spec is not None and a.spec.tree:  # a draft tree's branches are sequences of one KV cache
        from hypura.speculative.tree import context_params

        context.update(context_params(a.spec.tree))
    common = dict(n_threads=a.threads, n_threads_batch=a.threads, expert_cache=cache, plan=a.plan_file, **budgets,
                  n_gpu_layers=a.n_gpu_layers, param_overrides={"context_params": context},
                  draft_beside=a.spec.beside if a.spec is not None else None,
                  **({"rpc_servers": a.rpc, "rpc_mem": a.rpc_mem} if a.rpc else {}),
                  **({"split": True} if a.split else {}))
    if batched is not None:
        say(f"{max(batched.parallel)} sequences of {batched.n_ctx_per_seq} tokens at most")
        # a plan from budgets is made for the largest size (docs/engine.md)
        llm = load(a.model, Ask.of(**batched.llama_kwargs(**common)))
    else:
        # no plan or budgets: the default path, as hypura-cli's (a plan if the model does not fit the free memory)
        llm = load(a.model, Ask.of(n_ctx=a.ctx_size or (single.n_ctx if a.plan_file else 0),
                                       n_batch=max(max(a.n_prompt), 32), n_ubatch=512, verbose=False,
                                       fit=Fit(min_ctx=max(a.fit_ctx, single.n_ctx), say=say),
                                       parallel=a.spec.tree if a.spec is not None and a.spec.tree else 1, **common))
        if llm.fit_decision is None or llm.fit_decision.plan is None:
            say(f"context  {llm.n_ctx()}")
    say(f"threads  {llm.n_threads}" + (" (a quarter of the cores left to the disk reads)"
                                       if a.threads is None and llm.n_threads < cores()[0] else ""))
    plan = llm.plan
    try:
        # an expert cache's bound: at the rates the plan's cache was sized with, else the machine's
        run_rates = plan.rates if plan is not None and plan.expert_slots else rates()
        if batched is not None:
            result = run_batch_bench(llm, plan, dataclasses.replace(batched, n_threads=llm.n_threads), run_rates, say)
        elif a.spec is not None:
            from hypura.speculative.auto_draft import resolve

            spec = resolve(a.spec, llm)  # --spec-type auto / -md auto: what this plan gets
            if spec is None:
                raise HypuraError("speculative decoding of type auto: no draft found and n-gram drafting does not "
                                  "pay with this plan (a pass costs about its tokens)")
            result = run_spec_bench(llm, plan, spec, SpecBenchSettings(a.n_gen[0], a.repetitions), say, run_rates)
        else:
            result = run_bench(llm, plan, dataclasses.replace(single, n_threads=llm.n_threads), say, run_rates)
    finally:
        llm.close()
    result.update(model=str(a.model), machine={"host": platform.node(), "python": sys.version.split()[0]},
                  budgets={"gpu_mem": a.gpu_mem, "ram": a.ram}, flash_attn=a.flash_attn,
                  expert_cache=dataclasses.asdict(cache) if cache else None)
    shares = llm.decision.shares
    if shares is not None:  # the split over the RPC servers: its own bound (hypura.plan.shares)
        say(f"split    {shares.flags()}: predicted {shares.tok_s:.2f} tok/s decode (limit: {shares.limit})")
        result["split"] = {"devices": list(shares.device_names()), "layers": [n for n in shares.layers if n],
                           "host_layers": shares.host_layers, "n_ctx": shares.n_ctx,
                           "predicted_tok_s": shares.tok_s, "limit": shares.limit, "flags": shares.flags(),
                           "seconds": dict(shares.seconds)}
    if plan is not None:
        result["plan"] = {"mode": plan.mode, "config": plan.config, "memory": plan.memory,
                          "pool_slots": plan.pool_slots, "prefetch_depth": plan.prefetch_depth,
                          "routing_tokens": plan.routing_tokens, "parallel": plan.prediction.parallel,
                          "prediction": dataclasses.asdict(plan.prediction)}
    return result
