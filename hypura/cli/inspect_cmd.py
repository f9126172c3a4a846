"""`hypura inspect MODEL`: the placement plan for a model on a machine, from the GGUF header only."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from hypura.cachefile import write_atomic
from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan import SOLVERS, Budgets, PlanSettings, RateOverrides, model_units
from hypura.plan.search import ram_floor
from hypura.plan.auto import Fit
from hypura.plan.beside import Beside
from hypura.plan.budget import fmt_size
from hypura.plan.decision import Ask, Planner, Routing, decide
from hypura.plan.microbatch import outputs_needed
from hypura.plan.expected import expected
from hypura.plan.report import describe_plan, describe_tensors
from hypura.profile.free import free_memory
from hypura.profile.measure import planning_profile
from hypura.profile.store import load_cached, machine_profile
from hypura.sizes import fmt_mib
from hypura.store import resolve_path

# llama.cpp's -ctk/-ctv cache types: bytes per element (block size / block bytes for quantized)
KV_TYPES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
            "q4_1": 20 / 32, "q4_0": 18 / 32}


def _routing(path: str | None, header) -> Routing:
    """--routing FILE, else what runs of this model recorded (as a run plans)."""
    if not path:
        from hypura.runtime.moe.coactivation import routing_frequencies

        return Routing(*routing_frequencies(header))
    try:
        data = json.loads(Path(path).read_text())
        return Routing({int(layer): [float(f) for f in freqs] for layer, freqs in data.items()})
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise HypuraError(f"--routing {path}: expected JSON {{layer: [frequency per expert]}} ({e})") from None


def _ram_floor(plan, header, planner: Planner, routing: Routing, parallel: int) -> int | None:
    """The smallest --ram that plans the model with the plan's GPU budget, context and rates (search.ram_floor)."""
    if not planner.disk:
        return None
    settings = PlanSettings(n_ctx=plan.n_ctx, n_ubatch=plan.n_ubatch, prefetch_depth=plan.prefetch_depth,
                            kv_bytes_per_element=planner.kv_bytes_per_element, parallel=parallel)
    budgets = Budgets(gpu=plan.memory["gpu"]["budget"], ram=plan.memory["ram"]["budget"], unified=plan.unified)
    return ram_floor(model_units(header, routing.probs), budgets, plan.rates, settings, planner.solver)


@click.command("inspect")
@click.argument("model")
@click.option("--gpu-mem", metavar="SIZE", help="GPU memory budget, e.g. 8GiB (default: free now minus 1 GiB).")
@click.option("--ram", metavar="SIZE", help="RAM budget, e.g. 32GiB (default: available now minus 2 GiB).")
@click.option("-c", "--ctx-size", type=click.IntRange(0), default=0, show_default=True,
              help="Context length; 0: chosen as hypura-cli chooses it (at least --fit-ctx, more while decode keeps "
                   "its speed).")
@click.option("-fitc", "--fit-ctx", type=click.IntRange(1), default=4096, show_default=True,
              help="Smallest context an unset -c may get (llama.cpp's --fit-ctx).")
@click.option("-ub", "--ubatch-size", type=click.IntRange(1), default=512, show_default=True,
              help="Prefill micro-batch; at 512 (llama.cpp's default) a plan whose prompts wait on weight copies "
                   "may take a larger one.")
@click.option("-np", "--parallel", type=click.IntRange(1), default=1, show_default=True,
              help="Sequences decoded together (hypura serve/bench --parallel): plan for steps of this many tokens.")
@click.option("-kvu", "--kv-unified", "kv_unified", is_flag=True,
              help="As `hypura serve -np N -kvu` loads it: the N sequences share the KV cache's cells, as many as the "
                   "planner chooses (at most N x -c; -c is then each sequence's context, as serve's, default 4096 "
                   "within the training context); says the cells, where they live and what they cost the GPU.")
@click.option("--kv-type", type=click.Choice(sorted(KV_TYPES)), default="f16", show_default=True,
              help="KV cache element type (llama.cpp -ctk/-ctv).")
@click.option("--profile", "profile_spec", metavar="FILE|NAME",
              help="Machine profile file or bundled example (m1-max-32gb, h200-design); default: this machine's.")
@click.option("--gpu-bw", type=float, metavar="GB/s", help="Override: GPU decode weight-read rate.")
@click.option("--cpu-bw", type=float, metavar="GB/s", help="Override: CPU decode weight-read rate.")
@click.option("--link-bw", type=float, metavar="GB/s", help="Override: host->GPU copy rate.")
@click.option("--disk-bw", type=float, metavar="GB/s", help="Override: disk read rate.")
@click.option("--no-gpu", is_flag=True, help="Plan as if there were no GPU.")
@click.option("--no-disk", is_flag=True, help="Never stream from disk (fail if RAM + GPU are too small).")
@click.option("--prefetch-depth", type=click.IntRange(0), default=None, help="Layers prefetched ahead (default 2).")
@click.option("--routing", type=click.Path(dir_okay=False),
              help="JSON {layer: [expert frequencies]} to plan with (default: what runs of this model recorded, "
                   "else k/E).")
@click.option("--solver", type=click.Choice(sorted(SOLVERS)), default="optimizer", show_default=True)
@click.option("-md", "--model-draft", "draft", metavar="FILE",
              help="A speculative draft GGUF kept beside it (hypura-cli/serve -md): its memory is reserved first.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write the plan as JSON here.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Draw placement by layer and tier as a PNG.")
@click.option("--tensors", is_flag=True, help="List every tensor's tier.")
@click.option("--rpc", metavar="SERVERS", help="llama.cpp RPC servers (host:port,...): probed, measured (memory, "
                                               "link) and split over with the local GPUs (implies --split).")
@click.option("--rpc-mem", metavar="SIZE,...", help="Memory budget of each RPC device (default: free less 1 GiB).")
@click.option("--split", is_flag=True, help="Split the layers over every device (the profile's GPUs, the RPC "
                                            "servers) and the host, as llama.cpp's -sm layer runs them; --gpu-mem "
                                            "then takes a size per GPU (SIZE,SIZE,...).")
def inspect(model, gpu_mem, ram, ctx_size, fit_ctx, ubatch_size, parallel, kv_unified, kv_type, profile_spec, gpu_bw, cpu_bw, link_bw, disk_bw,
            no_gpu, no_disk, prefetch_depth, routing, solver, draft, json_out, plot, tensors, rpc, rpc_mem,
            split) -> None:
    """Show where every tensor of MODEL (a GGUF path, or a name from `hypura list`) would live and the
    predicted speed, reading only its header."""
    model = str(resolve_path(model))  # a path, or a name (`hypura list`)
    header = read_header(model)
    # this machine's: its cached profile with the CPU's rates on this model where they were measured
    profile = machine_profile(profile_spec) if profile_spec else planning_profile(model, say=None, measure=False)
    if rpc or split:
        _show_split(header, profile, this_machine=not profile_spec, rpc=rpc, rpc_mem=rpc_mem, gpu_mem=gpu_mem, ram=ram,
                    n_ctx=ctx_size, fit_ctx=fit_ctx, n_ubatch=ubatch_size, disk=not no_disk)
        return
    planner = Planner(kv_bytes_per_element=KV_TYPES[kv_type], disk=not no_disk, solver=solver,
                      overrides=RateOverrides(gpu_bw=gpu_bw, cpu_bw=cpu_bw, link_bw=link_bw, disk_bw=disk_bw,
                                              no_gpu=no_gpu),
                      **({"prefetch_depth": prefetch_depth} if prefetch_depth is not None else {}))
    # this machine, no budgets: what hypura-cli would do now (its line), and the plan within the same free memory
    default = not profile_spec and gpu_mem is None and ram is None and kv_type == "f16"
    # the outputs hypura-cli and serve read a step: one per sequence; every row where a draft is verified
    outputs = outputs_needed({}, all_rows=bool(draft), seqs=parallel)
    if kv_unified:  # serve's context: -c a sequence (plan/kv_cells.py chooses the cells, at most all of theirs)
        from hypura.serve.settings import ServeSettings

        ctx_size = parallel * ServeSettings(parallel=parallel, n_ctx=ctx_size or None).ctx_per_seq(header)
    ask = Ask(plan=None if default else "auto", gpu_mem=gpu_mem, ram=ram, n_ctx=ctx_size, n_ubatch=ubatch_size,
              n_outputs=outputs, n_gpu_layers=0 if no_gpu else -1, fit=Fit(min_ctx=fit_ctx), planner=planner,
              always_plan=True,
              beside=Beside.of(read_header(draft), ubatch_size, KV_TYPES[kv_type]) if draft else None,
              parallel=parallel, kv_cells=kv_unified)
    t0 = time.perf_counter()
    recorded = _routing(routing, header)
    decision = decide(header, ask, free_memory() if default else None, profile, routing=recorded)
    plan = decision.plan
    solve_ms = (time.perf_counter() - t0) * 1e3
    if default:
        click.echo(f"default  {decision.line}")
    if decision.cells is not None:
        click.echo(f"cells    {decision.cells.describe()}")
    if decision.beside_on_gpu is not None:
        size = fmt_size(ask.beside.nbytes(decision.n_ctx))
        click.echo(f"draft    {ask.beside.name}: {size} {'on the GPU' if decision.beside_on_gpu else 'in RAM'}, "
                   "reserved before the plan (weights, KV cache, compute buffer)")

    if not profile_spec and load_cached() is None:
        click.echo("note     no measured profile of this machine: rates are defaults (run `hypura profile`)")
    assumed = expected(plan, model_units(header, recorded.probs), recorded=recorded.probs is not None)
    for line in describe_plan(plan, header, None if no_gpu else profile, assumed):
        click.echo(line)
    floor = _ram_floor(plan, header, planner, recorded, parallel)
    if floor is not None:
        click.echo(f"floor    --ram {fmt_mib(floor)}: the smallest RAM budget that plans this model at context "
                   f"{plan.n_ctx} beside {fmt_size(plan.memory['gpu']['budget'])} of GPU (the disk holds the rest)")
    click.echo(f"planned in {solve_ms:.0f} ms")
    if tensors:
        click.echo("")
        for line in describe_tensors(plan):
            click.echo(line)
    if json_out:
        # the plan (Plan.load reads it) with what its prediction assumes beside it
        write_atomic(json_out, json.dumps({**plan.to_dict(), "expected": assumed.to_dict()}, indent=1) + "\n")
        click.echo(f"plan written to {json_out}")
    if plot:
        from hypura.cli.plan_plot import plot_plan

        plot_plan(plan, plot)
        click.echo(f"plot written to {plot}")


def _show_split(header, profile, *, this_machine: bool, rpc, rpc_mem, gpu_mem, ram, n_ctx: int, fit_ctx: int,
                n_ubatch: int, disk: bool) -> None:
    """--split / --rpc: the RPC servers registered and measured, then the split the load makes (the same decision),
    each device's share."""
    from hypura.plan.ask import DeviceAsk
    from hypura.plan.shares import describe_shares
    from hypura.plan.split import Devices
    from hypura.profile.rpc import measure_device
    from hypura.runtime.device_list import measure, register

    devices = DeviceAsk.of(rpc, None, rpc_mem, split=True, disk=disk)
    names = register(devices)
    # another machine's profile: its GPUs' free memory as recorded (and no library asked of this one's)
    measured = measure(names) if this_machine else Devices(tuple(measure_device(name) for name in names))
    for r in measured.rpc:
        click.echo(f"rpc      {r.name} at {r.endpoint}: {r.mem_free / 2**30:.1f} of {r.mem_total / 2**30:.1f} GiB "
                   f"free, link {r.link_bw / 1e9:.2f} GB/s, round trip {r.latency_s * 1e3:.2f} ms")
    ask = Ask(gpu_mem=gpu_mem, ram=ram, n_ctx=n_ctx, n_ubatch=n_ubatch, fit=Fit(min_ctx=fit_ctx), devices=devices)
    shares = decide(header, ask, free_memory() if this_machine else None, profile, devices=measured).shares
    click.echo(f"split    {header.path.name} over {len(shares.devices)} device(s) and the host, -c {shares.n_ctx}")
    for line in describe_shares(shares):
        click.echo(line)
