"""`hypura serve`: an Ollama- and OpenAI-compatible HTTP server over the batched engine (hypura/serve/)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from hypura.cli.spec_flags import spec_from_flags, spec_options
from hypura.errors import HypuraError
from hypura.serve.settings import DEFAULT_HOST, DEFAULT_MAX_LOADED, DEFAULT_PORT
from hypura.store.catalog import MODELS_DIR_ENV


def speculative(spec: dict, models_dir=None):
    """The --spec-* flags as the engine's SpecSettings; without -md or --spec-type, auto: a draft found in the
    stores, else n-gram drafting, where the model's plan makes it pay (speculative/auto_draft.py); --spec-type
    none: off."""
    from hypura.engine import EngineConfig
    from hypura.speculative.auto_draft import AutoDraft
    from hypura.speculative.settings import SpecSettings

    settings = spec_from_flags(spec, SpecSettings(type="auto", draft_model=AutoDraft(models_dir and Path(models_dir))))
    EngineConfig(speculative=settings)  # what the engine refuses (a tree), refused before any model loads
    return settings


@click.command("serve")
@click.option("-m", "--model", "models", multiple=True, metavar="PATH|NAME",
              help="Model loaded at start and kept: a GGUF path or a name from `hypura list` (repeat for several). "
                   "None: every model found is offered and loaded on its first request.")
@click.option("--models-dir", type=click.Path(file_okay=False), envvar=MODELS_DIR_ENV,
              help=f"A folder of GGUF files offered too, beside Ollama's and LM Studio's stores "
                   f"(or ${MODELS_DIR_ENV}).")
@click.option("--keep-alive", default=None, envvar="OLLAMA_KEEP_ALIVE", metavar="DURATION",
              help="How long a model loaded on demand stays loaded idle: seconds or 5m, 1h; negative: kept "
                   "(or $OLLAMA_KEEP_ALIVE; default 5m; a request's keep_alive overrides it).")
@click.option("--max-loaded", type=click.IntRange(0), default=DEFAULT_MAX_LOADED, show_default=True,
              envvar="OLLAMA_MAX_LOADED_MODELS",
              help="Models loaded on demand at once; the least recently used idle one is unloaded for another "
                   f"(or $OLLAMA_MAX_LOADED_MODELS; 0: {DEFAULT_MAX_LOADED}, as Ollama reads 0).")
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="Address to listen on (0.0.0.0 or :: opens the server to the network).")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port (Ollama's by default; 0 picks a free one).")
@click.option("-np", "--parallel", type=click.IntRange(1), default=4, show_default=True,
              help="Sequences decoded together in each step; more requests wait in the queue.")
@click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(16), default=None,
              help="Context per sequence, in tokens (prompt and reply). Default: 4096, less where the model's "
                   "training context over --parallel is less (the sequences share one KV cache).")
@click.option("--gpu-mem", metavar="SIZE", help="GPU memory budget, e.g. 8GiB: placement is planned from it.")
@click.option("--ram", metavar="SIZE", help="RAM budget, e.g. 16GiB: placement is planned from it.")
@click.option("--api-key", envvar="HYPURA_API_KEY", metavar="KEY",
              help="Require 'Authorization: Bearer KEY' on every route but /health (or $HYPURA_API_KEY).")
@click.option("--allowed-hosts", metavar="NAME", multiple=True,
              help="Answer requests whose Host is NAME too (repeatable; '*' answers any). Loopback names and "
                   "addresses and --host are always answered: DNS-rebinding pages are not.")
@click.option("--cors-origin", "cors_origins", metavar="ORIGIN", multiple=True,
              help="Let web pages of ORIGIN (e.g. https://app.example, http://192.168.1.5:*) call the server "
                   "(repeatable; '*' lets any). Pages on localhost may by default; other origins are refused.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1, max=86400), default=60, show_default=True,
              help="Seconds a request's headers, then its body, may take to arrive.")
@click.option("--max-queue", type=click.IntRange(1), default=64, show_default=True,
              help="Requests that may wait for a sequence; beyond them the server answers 429.")
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True,
              help="Reuse the KV of a prompt's prefix shared with an earlier request (a chat's earlier turns).")
@click.option("-kvu", "--kv-unified", is_flag=True, default=False,
              help="The sequences present share the KV cache's cells (as llama-server's -kvu): as many as the "
                   "planner chooses, from -c to -np x -c, weighed against the weights they take from the GPU (said "
                   "at start; `hypura inspect -np N -kvu` shows it); one may hold the whole cache (within the "
                   "training context); a request waits until its cells fit, and the youngest sequence is "
                   "preempted and recomputed where they run out. Off: each sequence holds -c.")
@click.option("-t", "--threads", type=click.IntRange(1), default=None,
              help="CPU threads for steps of one token per sequence (default: hypura.Llama's, physical cores).")
@click.option("-tb", "--threads-batch", type=click.IntRange(1), default=None,
              help="CPU threads for steps of several tokens: prompts, several sequences (default: same as -t).")
@click.option("--rpc", metavar="SERVERS", help="llama.cpp RPC servers (host:port,...): each model splits its layers "
                                               "over them and this machine (docs/devices.md).")
@click.option("--rpc-mem", metavar="SIZE,...", help="Memory budget of each RPC device (default: free less 1 GiB).")
@spec_options
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
def serve(models, models_dir, keep_alive, max_loaded, host, port, parallel, n_ctx, gpu_mem, ram, api_key,
          allowed_hosts, cors_origins, timeout_s, max_queue, prefix_cache, kv_unified, threads, threads_batch,
          rpc, rpc_mem, log_level, **spec) -> None:
    """Serve models over Ollama's API (/api/...) and OpenAI's (/v1/...), on 127.0.0.1:11434 by default.

    Without -m, every model in Ollama's store ($OLLAMA_MODELS or ~/.ollama/models), LM Studio's and
    --models-dir is offered by name (GET /api/tags), loaded on its first request within the memory free
    then, and unloaded after --keep-alive idle or when another model needs its memory. Models are named
    as Ollama names them, the same names in both APIs; a request can name only the models offered here."""
    import logging

    from hypura.plan.auto import Fit
    from hypura.serve.keep_alive import DEFAULT_S, KeepAliveError, parse_keep_alive
    from hypura.store import resolve_model

    try:
        from hypura.serve.server import Server
        from hypura.serve.settings import ServeSettings
    except ImportError as e:
        if e.name not in ("starlette", "uvicorn", "anyio"):
            raise
        raise HypuraError(f"hypura serve needs the server extra: pip install 'hypura[server]' ({e.name} is missing)")
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s: %(message)s")
    try:
        keep_alive_s = DEFAULT_S if keep_alive in (None, "") else parse_keep_alive(keep_alive)
    except KeepAliveError as e:
        raise HypuraError(f"--keep-alive: {e}") from None
    # a path stays a path (named from its file, as before); a name brings its store's name and defaults
    kept = [resolve_model(m, models_dir) for m in models]
    kept = tuple(Path(m.path) if m.source == "file" else m for m in kept)
    settings = ServeSettings(models=kept, models_dir=models_dir, keep_alive=keep_alive_s,
                             max_loaded=max_loaded or DEFAULT_MAX_LOADED,
                             host=host, port=port,
                             parallel=parallel, n_ctx=n_ctx, gpu_mem=gpu_mem, ram=ram, api_key=api_key,
                             max_queue=max_queue, prefix_cache=prefix_cache, kv_unified=kv_unified,
                             allowed_hosts=allowed_hosts,
                             cors_origins=cors_origins, timeout_s=timeout_s, speculative=speculative(spec, models_dir),
                             llama_kwargs={**_threads(threads, threads_batch),
                                           **({"rpc_servers": rpc, "rpc_mem": rpc_mem.split(",") if rpc_mem else None}
                                              if rpc else {}),
                                           # without budgets, each model is fitted to the free memory as
                                           # hypura-cli fits it, for --parallel sequences; its line on stderr
                                           "fit": Fit(say=lambda line: click.echo(line, err=True))})
    server = Server(settings, log_level=log_level)
    click.echo(f"hypura serve: listening on {server.url} (Ollama API at /api, OpenAI API at /v1)", err=True)
    server.run()
    if server.left_open:  # a tokenization still runs in llama.cpp: exit now rather than free the model under it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _threads(threads, threads_batch) -> dict:
    """-t/-tb as hypura.engine.load takes them (-tb unset: as -t, there)."""
    return {**({"n_threads": threads} if threads else {}),
            **({"n_threads_batch": threads_batch} if threads_batch else {})}
