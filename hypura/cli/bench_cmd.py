"""`hypura bench MODEL`: prefill and decode speed under a plan (or llama.cpp's placement), with medians,
spread, the bound and the plan's prediction (hypura/speed/); this file only parses the flags."""

from __future__ import annotations

import json

import click

from hypura.cli.spec_flags import spec_from_flags, spec_options
from hypura.errors import HypuraError


def parse_sizes(flag: str, text: str, least: int) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < least:
        raise HypuraError(f"{flag} {text!r}: want counts >= {least}, comma-separated (e.g. 1,4,16,32)")
    return sizes


@click.command("bench")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--gpu-mem", metavar="SIZE", help="GPU memory budget (simulates a smaller GPU), e.g. 8GiB.")
@click.option("--ram", metavar="SIZE", help="RAM budget (simulates less RAM), e.g. 16GiB.")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), help="Plan file (hypura inspect --json).")
@click.option("-p", "--n-prompt", metavar="N[,N,...]", default="512", show_default=True,
              help="Prompt tokens; several (1,2,4,8): one prefill pass of each, as llama-bench's -p, a row each with its "
                   "seconds a pass (what verifying N drafted tokens costs).")
@click.option("-n", "--n-gen", metavar="N[,N,...]", default="128", show_default=True,
              help="Generated tokens; several: one decode run of each from an empty context, as llama-bench's -n.")
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
@click.option("--rpc", metavar="SERVERS", help="llama.cpp RPC servers (host:port,...): with -ngl -1 and no plan, "
                                               "the layers split over them and this machine (docs/devices.md).")
@click.option("--rpc-mem", metavar="SIZE,...", help="Memory budget of each RPC device (default: free less 1 GiB).")
@click.option("--split", is_flag=True, help="Split the layers over this machine's GPUs (and the --rpc servers) and "
                                            "its RAM, as -sm layer runs them; --gpu-mem then takes a size per GPU.")
@spec_options
def bench(model, gpu_mem, ram, plan_file, n_prompt, n_gen, ctx_size, fit_ctx, repetitions, threads, n_gpu_layers,
          flash_attn, profile_spec, expert_slots, seed, json_out, parallel, rpc, rpc_mem, split, **spec) -> None:
    """Measure prefill (-p) and decode (-n) tok/s of MODEL, llama-bench style, beside the bound.

    Where the plan keeps experts on disk, the disk is also probed for a second before and after the runs
    with the plan's own expert reads, and the bound is printed again at that rate.

    With -md DRAFT or --spec-type: speculative decoding of -n greedy tokens from a text prompt beside plain
    decoding, -r times: tok/s, tokens and acceptance a pass, pass cost by tokens carried, the bound."""
    from hypura.speed.report import report
    from hypura.speed.run import BenchArgs, run

    args = BenchArgs(model, gpu_mem, ram, plan_file, parse_sizes("-p", n_prompt, 0), parse_sizes("-n", n_gen, 0),
                     ctx_size, fit_ctx, repetitions, threads, n_gpu_layers, flash_attn, profile_spec, expert_slots, seed,
                     parse_sizes("--parallel", parallel, 1) if parallel else (), spec_from_flags(spec), rpc,
                     tuple(rpc_mem.split(",")) if rpc_mem else None, split)
    result = run(args, say=lambda msg: click.echo(msg, err=True))
    for line in report(result):
        click.echo(line)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=1)
        click.echo(f"results written to {json_out}")
