"""Running the server: bind, serve with uvicorn, load the models meanwhile, shut down cleanly.

The socket is bound before anything loads (a taken port is one clear error, at once), then uvicorn
serves while a thread loads each `-m` model through `hypura.loaded.load` and starts its engine: /health answers
503 until every model is loaded, 200 after. A model that fails to load stops the server with its
error. Without -m, every model the stores hold (hypura.store) is offered at once and loaded on its first
request (models/registry.py; an unusable one is a line in the log and in its requests' answers). On shutdown
(Ctrl-C, SIGTERM, `stop()`) each open stream ends at once with a final error chunk (http/lifecycle.py), its
engine request cancelled; prompt work still running gets a few seconds to stop, then the engines and
models are closed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import signal
import socket
import threading
from pathlib import Path
from typing import Callable, Optional

import uvicorn

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.serve.app import ServerState, create_app
from hypura.serve.http import lifecycle
from hypura.serve.models.model_info import model_info
from hypura.serve.models.entry import Offer, offer_of
from hypura.serve.models.registry import Registry
from hypura.serve.settings import ServeSettings

log = logging.getLogger("hypura.serve")

_LEFT_OPEN: list = []  # registries whose models a stuck tokenization still reads at shutdown
GRACEFUL_SHUTDOWN_S = 5  # streams still open at shutdown get this long before they are cancelled
# uvicorn's default keeps idle connections 5 s; clients that pool connections reconnect when closed
KEEP_ALIVE_S = 5


def start_engine(path: Path, settings: ServeSettings):
    """(llm, engine) for `path`: a hypura.loaded.LoadedModel sized for `parallel` sequences of settings.ctx_per_seq tokens,
    planned from the budgets when given, and its batched engine, started."""
    from hypura.engine.config import EngineConfig
    from hypura.engine.loader import load
    from hypura.plan.auto import summary

    n_ctx_per_seq = settings.ctx_per_seq(read_header(path))
    config = EngineConfig(parallel=settings.parallel, max_queue=settings.max_queue, prefix_cache=settings.prefix_cache,
                          speculative=settings.speculative, kv_unified=settings.kv_unified)
    llm, engine = load(path, settings.parallel, n_ctx_per_seq, config=config, gpu_mem=settings.gpu_mem,
                       ram=settings.ram, **settings.llama_kwargs)
    if settings.kv_unified:  # the cells the decision chose (plan/kv_cells.py) and what they cost, in one line
        cells = llm.decision.cells
        log.info("%s: --kv-unified: %s; llama.cpp holds %d cells, a sequence up to %d tokens", path.name,
                 cells.describe() if cells is not None else f"{settings.parallel} sequences share the cache",
                 llm.context.n_ctx(), engine.n_ctx_per_seq)
    if llm.plan is not None and llm.fit_decision is None:  # a plan from the budgets said nothing yet: what it chose
        log.info("%s: plan: %s", path.name, summary(llm.plan))
    return llm, engine


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise HypuraError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)  # backlog: connections the kernel holds before uvicorn accepts them
    return sock


def _kept_offer(model) -> Offer:
    """A `serve -m` model: a path (named from its file and header, as before) or a store's model."""
    if isinstance(model, (str, Path)):
        from hypura.store.folder import stored_file

        header = read_header(model)
        info = model_info(Path(model), header)  # named from the file and its header, as before
        base = info.name.split(":")[0]
        return dataclasses.replace(offer_of(stored_file(Path(model), "file"), header), info=info,
                                   aliases=(base, f"{base}:latest"))
    return offer_of(model, read_header(model.path))


def _offer_stores(registry: Registry, models_dir) -> None:
    """Every model the stores hold, on offer; each unusable one is one line in the log (and its requests')."""
    from hypura.models import default_model_path
    from hypura.store import Catalog

    catalog = Catalog.scan(models_dir)
    for problem in catalog.problems:
        registry.broken(problem.name, problem.line)
        log.warning("cannot offer %s: %s", problem.name, problem.line)
    for stored in catalog:
        try:
            registry.offer(offer_of(stored, read_header(stored.path)))
        except HypuraError as e:  # ModelFileError: truncated, unsupported...
            registry.broken(stored.name, str(e))
            log.warning("cannot offer %s: %s", stored.name, e)
    if not registry.offers() and not catalog.problems:  # nothing found anywhere: the default model, if installed
        with contextlib.suppress(HypuraError):
            registry.offer(_kept_offer(default_model_path()))


class _Uvicorn(uvicorn.Server):
    async def shutdown(self, sockets=None) -> None:
        lifecycle.begin_shutdown()  # open streams end with an error chunk instead of waiting to be cancelled
        await super().shutdown(sockets)


class _Stopped(BaseException):
    """The signal that stopped the server, raised again by uvicorn once it has shut down."""


@contextlib.contextmanager
def _stop_signals_return():
    """uvicorn shuts down on SIGINT/SIGTERM, then raises the signal again for the handler it found; with
    this one, `run()` closes the models and returns (exit 0) instead of dying by the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(signum, frame):
        raise _Stopped()

    saved = {sig: signal.signal(sig, stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


class Server:
    """One `hypura serve`: `run()` blocks (the CLI), `start()` serves from a thread (tests, embedding)."""

    def __init__(self, settings: ServeSettings, engine_starter: Callable = start_engine, log_level: str = "info"):
        self.settings = settings
        self.state = ServerState(settings, registry=Registry(settings, engine_starter))
        # a missing or broken -m file is one error now, not after binding; a broken store entry is one line
        self.kept = [_kept_offer(m) for m in settings.models]
        if not self.kept:
            _offer_stores(self.state.registry, settings.models_dir)
        self.engine_starter = engine_starter
        self.sock = bind(settings.host, settings.port)
        self.port = self.sock.getsockname()[1]
        # access_log off: the Guard writes each request's one line, with what the engine did for it
        config = uvicorn.Config(create_app(self.state), log_level=log_level, lifespan="off", access_log=False,
                                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, timeout_keep_alive=KEEP_ALIVE_S,
                                http=functools.partial(lifecycle.HeaderDeadline, timeout_s=settings.timeout_s))
        self.uvicorn = _Uvicorn(config)
        self._loader = threading.Thread(target=self._load, name="hypura-serve-load", daemon=True)
        self._thread: Optional[threading.Thread] = None
        self.left_open = False  # shut down with prompt work still running: the process must exit, not unload

    @property
    def url(self) -> str:
        host = self.settings.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def _load(self) -> None:
        try:
            for offer in self.kept:
                entry = self.state.registry.load_pinned(offer)
                log.info("loaded %s as %s in %.1f s", offer.path, entry.name, entry.load_s)
                if entry.template_error:
                    log.warning("%s: %s (chat routes will answer 500)", entry.name, entry.template_error)
            self.state.registry.start_janitor()  # idle models on demand, and models whose file changed
            self.state.ready = True
            names = ", ".join(o.name for o in self.state.registry.offers())
            log.info("ready: %s", names if self.kept else f"offering {names or 'no model'} (loaded on demand)")
        except Exception as e:  # HypuraError, ModelFileError, llama.cpp's ValueError: the server cannot serve
            self.state.error = f"loading failed: {e}"
            self.uvicorn.should_exit = True

    def run(self) -> None:
        """Serve until stopped (Ctrl-C and SIGTERM stop it cleanly); raises HypuraError if a model failed
        to load."""
        self._loader.start()
        try:
            with _stop_signals_return():
                self.uvicorn.run(sockets=[self.sock])
        except _Stopped:
            pass
        finally:
            self._close()
        if self.state.error:
            raise HypuraError(self.state.error)

    def start(self) -> "Server":
        """Serve from a thread; a model that fails to load stops it, with the reason in `state.error`."""
        def run():
            with contextlib.suppress(HypuraError):
                self.run()

        self._thread = threading.Thread(target=run, name="hypura-serve", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    def _close(self) -> None:
        self._loader.join(GRACEFUL_SHUTDOWN_S)  # a model being loaded: closed too if it is done by then
        if self._loader.is_alive():
            log.warning("stopping while a model still loads")  # the registry closes it when its load ends
        self.state.ready = False
        if not lifecycle.drain(GRACEFUL_SHUTDOWN_S):  # llama.cpp would free a vocabulary still being read
            log.warning("prompt work still runs after %d s: the models are left to the process's exit",
                        GRACEFUL_SHUTDOWN_S)
            _LEFT_OPEN.append(self.state.registry)  # never collected: no __del__ frees them under the thread
            self.left_open = True
            self.sock.close()
            return
        self.state.registry.close(GRACEFUL_SHUTDOWN_S)
        self.sock.close()
