"""`hypura serve`: an Ollama- and OpenAI-compatible HTTP server over the batched engine (hypura/serve/)."""

from __future__ import annotations

from pathlib import Path

import click

from hypura.errors import HypuraError
from hypura.serve.settings import DEFAULT_HOST, DEFAULT_PORT


@click.command("serve")
@click.option("-m", "--model", "models", multiple=True, type=click.Path(dir_okay=False),
              help="GGUF model to serve (repeat for several; default: the default model, as hypura-cli).")
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="Address to listen on (0.0.0.0 or :: opens the server to the network).")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port (Ollama's by default; 0 picks a free one).")
@click.option("-np", "--parallel", type=click.IntRange(1), default=4, show_default=True,
              help="Sequences decoded together in each step; more requests wait in the queue.")
@click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(16), default=4096, show_default=True,
              help="Context per sequence, in tokens (prompt and reply).")
@click.option("--gpu-mem", metavar="SIZE", help="GPU memory budget, e.g. 8GiB: placement is planned from it.")
@click.option("--ram", metavar="SIZE", help="RAM budget, e.g. 16GiB: placement is planned from it.")
@click.option("--api-key", envvar="HYPURA_API_KEY", metavar="KEY",
              help="Require 'Authorization: Bearer KEY' on every route but /health (or $HYPURA_API_KEY).")
@click.option("--max-queue", type=click.IntRange(1), default=64, show_default=True,
              help="Requests that may wait for a sequence; beyond them the server answers 429.")
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True,
              help="Reuse the KV of a prompt's prefix shared with an earlier request (a chat's earlier turns).")
@click.option("-t", "--threads", type=click.IntRange(1), default=None,
              help="CPU threads for steps of one token per sequence (default: hypura.Llama's, physical cores).")
@click.option("-tb", "--threads-batch", type=click.IntRange(1), default=None,
              help="CPU threads for steps of several tokens: prompts, several sequences (default: same as -t).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
def serve(models, host, port, parallel, n_ctx, gpu_mem, ram, api_key, max_queue, prefix_cache, threads,
          threads_batch, log_level) -> None:
    """Serve models over Ollama's API (/api/...) and OpenAI's (/v1/...), on 127.0.0.1:11434 by default.

    Models are named as Ollama names them (GET /api/tags), the same names in both APIs; a request can
    name only the models loaded here."""
    import logging

    from hypura.models import default_model_path
    from hypura.plan.auto import Fit

    try:
        from hypura.serve.server import Server
        from hypura.serve.settings import ServeSettings
    except ImportError as e:
        if e.name not in ("starlette", "uvicorn", "anyio"):
            raise
        raise HypuraError(f"hypura serve needs the server extra: pip install 'hypura[server]' ({e.name} is missing)")
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s: %(message)s")
    settings = ServeSettings(models=tuple(Path(m) for m in models) or (default_model_path(),), host=host, port=port,
                             parallel=parallel, n_ctx=n_ctx, gpu_mem=gpu_mem, ram=ram, api_key=api_key,
                             max_queue=max_queue, prefix_cache=prefix_cache,
                             llama_kwargs={**_threads(threads, threads_batch),
                                           # without budgets, each model is fitted to the free memory as
                                           # hypura-cli fits it, for --parallel sequences; its line on stderr
                                           "fit": Fit(say=lambda line: click.echo(line, err=True))})
    server = Server(settings, log_level=log_level)
    click.echo(f"hypura serve: listening on {server.url} (Ollama API at /api, OpenAI API at /v1)", err=True)
    server.run()


def _threads(threads, threads_batch) -> dict:
    """-t/-tb as hypura.engine.load takes them (-tb unset: as -t, there)."""
    return {**({"n_threads": threads} if threads else {}), **({"n_threads_batch": threads_batch} if threads_batch else {})}
