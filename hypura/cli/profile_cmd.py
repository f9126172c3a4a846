"""`hypura profile`: measure this machine (or show the cached measurement)."""

from __future__ import annotations

from pathlib import Path

import click

from hypura.plan.report import describe_profile
from hypura.profile.measure import get_profile


@click.command("profile")
@click.option("--force", is_flag=True, help="Measure again even when a fresh cached profile exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON instead of a table.")
@click.option("--path", type=click.Path(file_okay=False, exists=True),
              help="Measure the filesystem holding this folder (default: --model's, else $HYPURA_MODELS, else "
                   "the current one).")
@click.option("--model", type=click.Path(dir_okay=False, exists=True),
              help="The GGUF you will run: its disk is measured (by reading it, read only, when it is 1 GiB or "
                   "more), and llama.cpp's CPU rates on its own blocks (default: SmolLM2-135M's).")
def profile(force, as_json, path, model) -> None:
    """Measure RAM, GPU links, disk (O_DIRECT) and llama.cpp's CPU rate; cached per machine."""
    if path is None and model is not None:
        path = str(Path(model).resolve().parent)  # the disk the model streams from
    prof, cache_file, measured = get_profile(force=force, path=path, model=model, disk_file=model)
    if as_json:
        click.echo(prof.to_json(), nl=False)
        return
    for line in describe_profile(prof):
        click.echo(line)
    click.echo(f"{'saved to' if measured else 'cached at'} {cache_file}"
               + ("" if measured else " (--force to measure again)"))
