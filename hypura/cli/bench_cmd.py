"""`hypura bench MODEL`: prefill and decode speed under a plan (or llama.cpp's placement), with
medians, spread, the bound and the plan's prediction."""

from __future__ import annotations

import dataclasses
import json
import platform
import sys

import click

from hypura.bench import BenchSettings, run_bench
from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.profile.host import cores
from hypura.profile.measure import planning_profile
from hypura.profile.store import resolve_profile
from hypura.plan.auto import Fit
from hypura.plan.budget import parse_size, rates_for
from hypura.runtime.moe.expert_streaming import ExpertCacheSettings, slots_for_budget
from hypura.runtime.stats import describe


@click.command("bench")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--gpu-mem", metavar="SIZE", help="GPU memory budget (simulates a smaller GPU), e.g. 8GiB.")
@click.option("--ram", metavar="SIZE", help="RAM budget (simulates less RAM), e.g. 16GiB.")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), help="Plan file (hypura inspect --json).")
@click.option("-p", "--n-prompt", type=click.IntRange(0), default=512, show_default=True, help="Prompt tokens.")
@click.option("-n", "--n-gen", type=click.IntRange(0), default=128, show_default=True, help="Generated tokens.")
@click.option("-c", "--ctx-size", type=click.IntRange(0), default=0, show_default=True,
              help="Context; 0: as hypura-cli chooses it (at least --fit-ctx and what the runs need).")
@click.option("-fitc", "--fit-ctx", type=click.IntRange(1), default=4096, show_default=True,
              help="Smallest context an unset -c may get (llama.cpp's --fit-ctx).")
@click.option("-r", "--repetitions", type=click.IntRange(1), default=3, show_default=True)
@click.option("-t", "--threads", type=click.IntRange(1), default=None,
              help="CPU threads (default: physical cores, a quarter fewer when experts page from disk).")
@click.option("-ngl", "--n-gpu-layers", type=int, default=-1, show_default=True,
              help="Without a plan or budgets: llama.cpp's placement with this many layers on the GPU.")
@click.option("-fa", "--flash-attn", type=click.Choice(["on", "off", "auto"]), default="auto", show_default=True,
              help="Flash attention, as llama-bench's -fa (llama-cpp-python's default is off).")
@click.option("--profile", "profile_spec", metavar="FILE|NAME",
              help="Machine profile to plan with (default: this machine's).")
@click.option("--expert-slots", type=click.IntRange(-1), default=None,
              help="MoE: an expert cache of this many slots a layer in GPU memory, the experts pinned in RAM "
                   "(-1: as many as --gpu-mem leaves beside the other tensors); llama.cpp places the rest.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the random tokens (a run that records routing for a later plan should use another).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write all results as JSON here.")
@click.option("--parallel", metavar="N,N,...", default=None,
              help="The batched engine at these sequence counts, as llama-batched-bench: -p prompt tokens and -n "
                   "decode steps per sequence; aggregate prefill and decode tok/s beside the bound.")
def bench(model, gpu_mem, ram, plan_file, n_prompt, n_gen, ctx_size, fit_ctx, repetitions, threads, n_gpu_layers, flash_attn,
          profile_spec, expert_slots, seed, json_out, parallel) -> None:
    """Measure prefill (-p) and decode (-n) tok/s of MODEL, llama-bench style, beside the bound.

    Where the plan keeps experts on disk, the disk is also probed for a second before and after the runs
    with the plan's own expert reads, and the bound is printed again at that rate."""
    import llama_cpp

    from hypura.llama import Llama
    header = read_header(model)
    # the profile named, else this machine's (measured now if it has none, as hypura-cli would)
    profile_of = lambda spec: resolve_profile(spec) if spec else planning_profile(model)  # noqa: E731
    n_ctx = max(256, n_prompt + n_gen + 64)  # what the runs need
    if ctx_size and ctx_size < n_ctx:
        raise HypuraError(f"-c {ctx_size} is too small for -p {n_prompt} and -n {n_gen}: give at least {n_ctx}")
    min_ctx = max(fit_ctx, n_ctx)
    # --- --parallel: the batched engine (hypura/engine/bench.py); the plan budgets every sequence's KV
    batched = None
    if parallel:
        from hypura.engine.bench import BatchBenchSettings, parse_parallel

        batched = BatchBenchSettings(n_prompt, n_gen, parse_parallel(parallel), repetitions, seed)
        n_ctx = max(batched.parallel) * batched.n_ctx_per_seq
    # --- end --parallel
    if plan_file and (gpu_mem or ram):
        raise HypuraError("give --plan or --gpu-mem/--ram budgets (which make a plan), not both")
    plan, cache, rates = None, None, None
    if expert_slots is not None:
        if plan_file or ram:
            raise HypuraError("--expert-slots sizes the GPU cache itself: give --gpu-mem only")
        if expert_slots < 0:
            if not gpu_mem:
                raise HypuraError("--expert-slots -1 needs --gpu-mem")
            expert_slots = slots_for_budget(header, parse_size(gpu_mem))
        rates = rates_for(profile_of(profile_spec))  # for the bound
        cache = ExpertCacheSettings(expert_slots)
    elif plan_file:
        plan = plan_file
    say = lambda msg: click.echo(msg, err=True)  # noqa: E731
    # hypura.Llama plans within the budgets, with the profile named (checked against this machine's memory)
    budgets = {"gpu_mem": gpu_mem, "ram": ram, "profile": resolve_profile(profile_spec) if profile_spec else None} \
        if cache is None else {}
    say(f"loading {model} ({'plan' if plan or gpu_mem or ram else 'plan or llama.cpp placement by free memory' if cache is None and n_gpu_layers in (0, -1) else f'-ngl {n_gpu_layers}'}) ...")
    fa = {"on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
          "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO}[flash_attn]
    if batched is not None:  # --- --parallel
        from hypura.cli.bench_parallel import bench_parallel

        bench_parallel(model, plan, budgets, batched, threads=threads, n_gpu_layers=n_gpu_layers, flash_attn_type=fa,
                       expert_cache=cache, rates=rates or rates_for(profile_of(profile_spec)), say=say,
                       json_out=json_out, extra={"budgets": {"gpu_mem": gpu_mem, "ram": ram}, "flash_attn": flash_attn,
                                                 "expert_cache": dataclasses.asdict(cache) if cache else None})
        return  # --- end --parallel
    # no plan or budgets: the default path, as hypura-cli's (a plan if the model does not fit the free memory)
    llm = Llama(model, plan=plan, **budgets, n_ctx=ctx_size or (n_ctx if plan else 0),
                n_batch=max(n_prompt, 32), n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, n_gpu_layers=n_gpu_layers, verbose=False,
                param_overrides={"context_params": {"flash_attn_type": fa}}, expert_cache=cache,
                fit=Fit(min_ctx=min_ctx, say=say))
    if llm.fit_decision is None or llm.fit_decision.plan is None:
        say(f"context  {llm.n_ctx()}")
    s = BenchSettings(n_prompt, n_gen, repetitions, llm.n_threads, seed)  # the threads Llama chose, for the JSON
    say(f"threads  {llm.n_threads}" + (" (a quarter of the cores left to the disk reads)"
                                       if threads is None and llm.n_threads < cores()[0] else ""))
    try:
        if llm.plan is not None and llm.plan.expert_slots:
            rates = llm.plan.rates  # what the plan's cache was sized with
        result = run_bench(llm, llm.plan, s, say, rates or rates_for(profile_of(profile_spec)))
    finally:
        llm.close()
    result["model"] = str(model)
    result["machine"] = {"host": platform.node(), "python": sys.version.split()[0]}
    result["budgets"] = {"gpu_mem": gpu_mem, "ram": ram}
    result["expert_cache"] = dataclasses.asdict(cache) if cache else None
    result["flash_attn"] = flash_attn
    if llm.plan is not None:
        result["plan"] = {"mode": llm.plan.mode, "config": llm.plan.config, "memory": llm.plan.memory,
                          "pool_slots": llm.plan.pool_slots, "prefetch_depth": llm.plan.prefetch_depth,
                          "routing_tokens": llm.plan.routing_tokens}
    for line in report(result):
        click.echo(line)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=1)
        click.echo(f"results written to {json_out}")


def report(r: dict) -> list[str]:
    lines = []
    for phase in ("prefill", "decode"):
        m = r[f"{phase}_tok_s"]
        if m:
            lines.append(f"{phase:8s} {m['median']:9.2f} tok/s  (median of {len(m['runs'])}: min {m['min']:.2f}, "
                         f"max {m['max']:.2f})")
    lines += describe(r["stats"])
    if (r.get("plan") or {}).get("routing_tokens"):
        lines.append(f"plan     expert frequencies from {r['plan']['routing_tokens']} tokens of recorded routing")
    if r.get("bound"):
        b = r["bound"]
        ratio = f"; measured/bound {r['bound_ratio']:.2f}" if "bound_ratio" in r else ""  # none without decode (-n 0)
        lines.append(f"bound    {b['decode_tok_s']:9.2f} tok/s  ({b['limit']}){ratio}")
    if r.get("bound_now"):
        p = r["disk_probe"]
        lines.append(f"bound    {r['bound_now']['decode_tok_s']:9.2f} tok/s  (disk as probed beside the runs: "
                     f"{p['before']['gbps']:.2f} GB/s before, {p['after']['gbps']:.2f} after, bursts of "
                     f"{p['after']['experts_per_burst']} expert(s)); measured/bound {r['bound_now_ratio']:.2f}")
    return lines
