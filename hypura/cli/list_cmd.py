"""`hypura list`: the models found where they already are (Ollama's store, LM Studio's, --models-dir), and
with --plan what Hypura would do with each on this machine now (as `hypura inspect` decides it)."""

from __future__ import annotations

import click

from hypura.errors import HypuraError
from hypura.sizes import fmt_size
from hypura.store.catalog import MODELS_DIR_ENV, Catalog


def plan_now(header, profile, catalog=()):
    """(mode, context, predicted decode tok/s, draft) on this machine's free memory: hypura-cli's default path, and
    where the model fits as llama.cpp places it, the plan within the same memory (as `hypura inspect`); the draft
    `-md auto` and `hypura serve` would keep beside it from `catalog` (speculative/auto_draft.py; "-": none)."""
    from hypura.loaded.measured import Measured
    from hypura.plan.auto import Fit
    from hypura.plan.decision import Ask
    from hypura.profile.free import free_memory
    from hypura.speculative.auto_draft import find_draft

    fit = Fit(free=free_memory(), measure_profile=False)
    ask, machine = Ask(fit=fit, always_plan=True), Measured(header.path, header, (), fit, profile)  # as a run reads it
    decision, found = find_draft(header, ask, machine, catalog)
    plan = decision.plan
    draft = f"{found.name} ({found.gain:.1f}x)" if found else "-"
    return (f"fits ({plan.mode})" if decision.fits else plan.mode), decision.n_ctx, plan.prediction.decode_tok_s, draft


@click.command("list")
@click.option("--plan", "with_plan", is_flag=True,
              help="Also what Hypura would do with each model on this machine now: mode, context, predicted tok/s, "
                   "and the draft -md auto and `hypura serve` would keep beside it (with its predicted gain).")
@click.option("--models-dir", type=click.Path(file_okay=False), envvar=MODELS_DIR_ENV,
              help=f"A folder of GGUF files searched too (or ${MODELS_DIR_ENV}).")
def list_models(with_plan, models_dir) -> None:
    """List the models Hypura finds by name: Ollama's store ($OLLAMA_MODELS or ~/.ollama/models), LM Studio's
    (~/.lmstudio/models) and --models-dir. Any of these names works with hypura-cli -m, inspect and serve."""
    from hypura.modelfile import read_header
    from hypura.serve.models.model_info import quantization_level

    catalog = Catalog.scan(models_dir)
    profile = None
    if with_plan:
        from hypura.profile.store import machine_profile

        profile = machine_profile(None)
    rows = [("NAME", "SIZE", "QUANT", *(("MODE", "CONTEXT", "TOK/S", "DRAFT") if with_plan else ()), "WHERE")]
    problems = [f"{p.name}: {p.line}" for p in catalog.problems]
    for m in catalog:
        try:
            header = read_header(m.path)
            planned = plan_now(header, profile, list(catalog)) if with_plan else ()
        except HypuraError as e:  # a broken file (ModelFileError) or a plan that cannot be made
            problems.append(f"{m.name}: {e}")
            continue
        if planned:
            planned = (planned[0], str(planned[1]), f"{planned[2]:.1f}", planned[3])
        rows.append((m.name, fmt_size(m.size), quantization_level(header.metadata) or "?", *planned, m.where))
    if len(rows) == 1:
        where = ", ".join(str(root) for _, root in catalog.searched)
        click.echo(f"no models found (searched {where})")
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    for line in problems:
        click.echo(f"hypura list: cannot use {line}", err=True)
