"""`hypura routing MODEL`: the expert routing that runs of a MoE model recorded, which plans follow."""

from __future__ import annotations

import click
import numpy as np

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.runtime.moe.coactivation import MIN_TOKENS, CoactivationPredictor, model_key, recorded_routing


@click.command("routing")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--reset", is_flag=True, help="Forget what runs recorded for this model.")
def routing(model, reset) -> None:
    """Show how often runs of MODEL chose each expert (plans keep often-chosen experts in RAM), or forget it."""
    header = read_header(model)
    name, recorded = header.path.name, recorded_routing(header)
    if recorded is None:
        raise HypuraError(f"{name} has fewer than two MoE layers: no routing is recorded for it")
    layers, k, predictor = recorded
    n_expert = predictor.selections.shape[1]
    key = model_key(header)
    path = CoactivationPredictor.path_for(key)
    if reset:
        CoactivationPredictor.reset(key)
        click.echo(f"forgot the routing recorded for {name} ({path})")
        return
    chosen, per_layer = predictor.selections, predictor.tokens(k)
    tokens = int(per_layer.max())
    click.echo(f"model    {name}: {len(layers)} MoE layers, {n_expert} experts, {k} chosen a token")
    if not tokens:
        click.echo("recorded nothing yet: runs whose plan reads experts from disk, or with an expert cache or "
                   "on_route, record their routing")
        return
    use = "plans use it" if tokens >= MIN_TOKENS else f"plans use it from {MIN_TOKENS} tokens on"
    click.echo(f"recorded {tokens} tokens ({use}); {path}")
    # a prompt's last layer routes its output tokens only: that layer may have far fewer tokens than the others
    counted = chosen[per_layer >= MIN_TOKENS].astype(np.float64)
    if not len(counted):
        return
    top = max(1, n_expert // 10)
    shares = np.sort(counted, axis=1)[:, ::-1][:, :top].sum(axis=1) / counted.sum(axis=1)
    click.echo(f"skew     the {top} most chosen experts of a layer took {shares.mean():.0%} of its choices "
               f"({len(counted)} layers with {MIN_TOKENS}+ tokens: {shares.min():.0%}..{shares.max():.0%}; "
               f"uniform routing: {top / n_expert:.0%})")
