"""`hypura bench MODEL --parallel 1,4,16,32`: loads the model for the batched engine, runs
hypura.engine.bench at each size, prints the table and writes the JSON."""

from __future__ import annotations

import dataclasses
import json
import platform
import sys

import click

from hypura.engine.bench import BatchBenchSettings, report, run_batch_bench


def bench_parallel(model, plan, budgets: dict, settings: BatchBenchSettings, *, threads, n_gpu_layers, flash_attn_type, expert_cache,
                   rates, say, json_out, extra: dict) -> None:
    """extra: what the JSON records besides (budgets, flash attention, expert cache)."""
    from hypura.llama import Llama

    say(f"{max(settings.parallel)} sequences of {settings.n_ctx_per_seq} tokens at most")
    # a plan from budgets is made for the largest size (docs/engine.md)
    llm = Llama(model, n_threads=threads, n_threads_batch=threads, expert_cache=expert_cache,
                **settings.llama_kwargs(plan=plan, **budgets, n_gpu_layers=n_gpu_layers,
                                        param_overrides={"context_params": {"flash_attn_type": flash_attn_type}}))
    settings = dataclasses.replace(settings, n_threads=llm.n_threads)
    say(f"threads  {llm.n_threads}")
    try:
        result = run_batch_bench(llm, llm.plan, settings, rates, say)
    finally:
        llm.close()
    result.update(model=str(model), machine={"host": platform.node(), "python": sys.version.split()[0]}, **extra)
    if llm.plan is not None:
        result["plan"] = {"mode": llm.plan.mode, "config": llm.plan.config, "memory": llm.plan.memory,
                          "parallel": llm.plan.prediction.parallel,
                          "prediction": dataclasses.asdict(llm.plan.prediction)}
    for line in report(result):
        click.echo(line)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=1)
        click.echo(f"results written to {json_out}")
