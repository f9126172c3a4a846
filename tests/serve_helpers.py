"""The real server for tests: `hypura serve`'s Server with the real engine and the default model, in this
process, on 127.0.0.1 and a free port."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
import time

import httpx

from hypura.serve.server import Server
from hypura.serve.settings import ServeSettings
from serve_fakes import MODEL  # noqa: F401  (the default model's name, for the tests importing it from here)
# one llama.cpp thread: ggml's workers spin while they wait, and on a busy 2-core machine two starve each other
ONE_THREAD = {"n_threads": 1, "n_threads_batch": 1}


def real_server(model_path, parallel=4, n_ctx=512, **settings) -> Server:
    settings.setdefault("llama_kwargs", ONE_THREAD)
    server = Server(ServeSettings(models=(model_path,), port=0, parallel=parallel, n_ctx=n_ctx, **settings),
                    log_level="warning").start()
    deadline = time.monotonic() + 120
    while not server.state.ready:
        assert server.state.error is None, server.state.error
        assert time.monotonic() < deadline, "the model did not load in 120 s"
        time.sleep(0.05)
    return server


def serving(model_path, **settings):
    """A module fixture's body, `yield from serving(path, n_ctx=...)`: the real server, stopped after the module."""
    server = real_server(model_path, **settings)
    try:
        yield server
    finally:
        server.stop()


def openai_client(server):
    """The official `openai` client of `server`, which must not retry: a test sees the first answer."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def engine_of(server):
    return next(iter(server.state.registry)).engine


def wait_idle(engine, timeout=10.0) -> dict:
    """engine.metrics() once no request is active or queued (fails after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        m = engine.metrics()
        if m["requests"]["active"] == 0 and m["requests"]["queued"] == 0:
            return m
        assert time.monotonic() < deadline, f"requests left running: {m['requests']}"
        time.sleep(0.02)


@contextlib.contextmanager
def health_probed(url: str, every: float = 0.05):
    """/health polled on a thread while the block runs; yields the list of its answers' seconds (each a 200)."""
    seen, stop = [], threading.Event()

    def probe():
        with httpx.Client(base_url=url, timeout=10) as c:
            while not stop.is_set():
                started = time.monotonic()
                assert c.get("/health").status_code == 200
                seen.append(time.monotonic() - started)
                time.sleep(every)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        yield seen
    finally:
        stop.set()
        prober.join()


# --- a `hypura serve` process -------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, limit_s: float = 120) -> None:
    """Until the server at `url` answers /health 200 (fails if it exits first)."""
    deadline = time.monotonic() + limit_s
    while True:
        assert proc.poll() is None, f"the server exited with status {proc.returncode}"
        assert time.monotonic() < deadline, f"not ready in {limit_s} s"
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def stop(proc: subprocess.Popen) -> int:
    """Ctrl-C, as a user stops a server; its exit status."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=60)
    finally:
        proc.kill()
