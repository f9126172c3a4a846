"""`hypura synth SHAPE OUT.gguf`: write a random-weight GGUF with a real model's shapes."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hypura.synth.quant_mix import FTYPES
from hypura.synth.routing import Routing
from hypura.synth.shapes import SHAPES
from hypura.synth.writer import write_synth


HELP = f"""Write a random-weight GGUF with a real model's shapes and quant mix.

SHAPE is one of: {", ".join(SHAPES)}. The tiny-* shapes are for tests.

With --draft-for TARGET.gguf, the one argument is OUT.gguf: a draft model for TARGET (its
vocabulary, embeddings and output head, its first --layers blocks with their outputs scaled down)
whose greedy tokens agree with a target that follows its embeddings (one made with
--block-out-scale 0.000001) about --agreement of the time.
"""


@click.command("synth", help=HELP)
@click.argument("shape", metavar="SHAPE")
@click.argument("out", metavar="OUT.gguf", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--draft-for", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              metavar="TARGET.gguf", help="Write a draft model for TARGET instead (see above).")
@click.option("--agreement", type=float, default=0.8, show_default=True, metavar="P",
              help="--draft-for: how often the draft's greedy token is the target's.")
@click.option("--layers", type=int, default=None, metavar="N",
              help="Keep only the first N blocks (same per-layer shapes, smaller file); --draft-for: 2.")
@click.option("--ftype", default=None, metavar="|".join(FTYPES),
              help="File type: tensor types as llama.cpp's quantizer picks them for it. Default: the "
                   "shape's published one (q4_k_m; gpt-oss: mxfp4_moe).")
@click.option("--sparse", is_flag=True,
              help="Header only: the data region is a hole of the right size. Instant, for planner "
                   "tests; all weights read as zero, so the file is not meant to be run.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed for the weights.")
@click.option("--tokenizer-from", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              metavar="GGUF", help="Copy the tokenizer of this GGUF (default: the default model's).")
@click.option("--router-skew", type=float, default=0.0, show_default=True, metavar="A",
              help="MoE: expert popularity follows Zipf(A) over a random order per layer; 0: all equal "
                   "(the worst case for caches).")
@click.option("--router-layer-corr", type=float, default=0.0, show_default=True, metavar="R",
              help="MoE: correlation in [0, 1] of consecutive layers' routers, so that expert e at "
                   "layer l+1 tends to fire after expert e at layer l.")
@click.option("--block-out-scale", type=float, default=1.0, show_default=True, metavar="S",
              help="Std of the blocks' output projections (attn_output, ffn_down*) relative to the other "
                   "weights. Small values (0.05) keep every layer's hidden state near its token's "
                   "embedding, so routers act on token-specific states: the router knobs then hold at "
                   "every layer, and skew 0 is uniformly random routing.")
def synth(shape: str, out: Path, layers: int | None, ftype: str | None, sparse: bool, seed: int,
          tokenizer_from: Path | None, router_skew: float, router_layer_corr: float, block_out_scale: float,
          draft_for: Path | None, agreement: float) -> None:
    if draft_for is not None:
        return _draft(draft_for, Path(shape) if out is None else out, agreement, layers or 2, seed)
    if out is None:
        raise click.UsageError("missing argument OUT.gguf")
    show = sys.stderr.isatty() and not sparse
    progress = _Progress() if show else None
    r = write_synth(shape, out, layers=layers, ftype=ftype, sparse=sparse, seed=seed,
                    tokenizer_from=tokenizer_from, routing=Routing(router_skew, router_layer_corr, block_out_scale),
                    progress=progress)
    if progress:
        progress.done()
    s = r.shape
    what = f"{s.name} {r.ftype.name}, {s.n_layer} layers, {len(r.tensors)} tensors"
    size = _size(r.file_bytes)
    if r.sparse:
        click.echo(f"wrote {r.path}: {what}, {size} (sparse: header only, not runnable)")
    else:
        click.echo(f"wrote {r.path}: {what}, {size} in {r.seconds:.1f} s ({r.mb_per_s:.0f} MB/s)")


def _draft(target: Path, out: Path, agreement: float, layers: int, seed: int) -> None:
    from hypura.synth.draft import write_draft

    r = write_draft(target, out, agreement, layers=layers, seed=seed)
    click.echo(f"wrote {r.path}: draft for {target.name}, {r.layers} layers, output-norm noise {r.eps:.4g} "
               f"(agreement {r.predicted_agreement:.2f} on sampled tokens when the target follows its embeddings)")


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class _Progress:
    """A percentage on stderr, redrawn at most once per percent."""

    def __init__(self) -> None:
        self.last = -1

    def __call__(self, done: int, total: int) -> None:
        pct = done * 100 // max(total, 1)
        if pct != self.last:
            self.last = pct
            click.echo(f"\rwriting {pct:3d}%", nl=False, err=True)

    def done(self) -> None:
        click.echo("\r" + " " * 12 + "\r", nl=False, err=True)
