"""`hypura serve -m` over SmolLM2 whose file is replaced while a request runs: the old copy serves its request to
the end beside the new one; a further change while it still serves waits for that request (at most two copies of
a model held), then loads the file as it is; the wait is bounded (503 with an error body). The real server and
engine, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from hypura.serve.models import registry as registry_module  # noqa: E402
from hypura.serve.server import Server, start_engine  # noqa: E402
from hypura.serve.settings import ServeSettings  # noqa: E402
from serve_helpers import ONE_THREAD  # noqa: E402

WAIT_S = 120  # generous: CI is a busy 2-core machine


class Copies:
    """The real engine starter, counting the copies of the model open at once."""

    def __init__(self):
        self.lock, self.open, self.most, self.loads, self.engines = threading.Lock(), 0, 0, 0, []

    def __call__(self, path, settings):
        llm, engine = start_engine(path, settings)
        with self.lock:
            self.open += 1
            self.loads += 1
            self.most = max(self.most, self.open)
            self.engines.append(engine)
        close, closed = llm.close, []

        def counted_close():
            with self.lock:
                if not closed:
                    closed.append(True)
                    self.open -= 1
            close()

        llm.close = counted_close
        return llm, engine


def _until(check, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _replace(path, source) -> None:
    fresh = path.with_name(path.name + ".new")
    shutil.copyfile(source, fresh)
    os.replace(fresh, path)  # a new inode under the same name


def _short(c: httpx.Client) -> httpx.Response:
    return c.post("/v1/completions", json={"model": "smol", "prompt": "Hi", "max_tokens": 3, "temperature": 0})


class Held:
    """A streamed request on copy `engine`, stopped after its first chunk while the test holds that engine
    between steps (its lease stays held), then let go to its end."""

    def __init__(self, url: str, engine):
        self.engine, self.first, self.chunks, self.done, self.error = engine, threading.Event(), 0, False, None
        self._hold = contextlib.ExitStack()
        self._thread = threading.Thread(target=self._run, args=(url,))
        self._thread.start()
        assert self.first.wait(WAIT_S), self.error or "no first chunk"
        # the engine's loop waits between steps while the test holds its step lock: no further token
        self._hold.enter_context(engine._inbox.between_steps(engine._step_lock))
        assert engine.metrics()["requests"]["active"] == 1, "the request ended before it was held"

    def _run(self, url: str) -> None:
        body = {"model": "smol", "prompt": "1, 2, 3, 4,", "max_tokens": 200, "ignore_eos": True, "stream": True,
                "temperature": 0}
        try:
            with httpx.Client(base_url=url, timeout=WAIT_S) as c, c.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: "):
                        assert "error" not in json.loads(line[6:]), line
                        self.chunks += 1
                        self.first.set()
        except Exception as e:  # noqa: BLE001  (the test reads it)
            self.error = repr(e)
            self.first.set()

    def finish(self) -> None:
        self._hold.close()
        self._thread.join(WAIT_S)
        assert self.error is None and self.done, self.error


@pytest.fixture()
def smol(tmp_path, smollm2_path):
    path = tmp_path / "smol.gguf"
    shutil.copyfile(smollm2_path, path)
    return path


@pytest.fixture()
def served(smol):
    copies = Copies()
    server = Server(ServeSettings(models=(smol,), port=0, parallel=2, n_ctx=256, llama_kwargs=ONE_THREAD),
                    engine_starter=copies, log_level="warning").start()
    try:
        _until(lambda: server.state.ready or server.state.error, "the first load")
        assert server.state.error is None, server.state.error
        yield server, copies
    finally:
        server.stop()


def test_a_file_changed_twice_under_a_request_holds_two_copies_at_most(served, smol, smollm2_path, caplog):
    server, copies = served
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as c, caplog.at_level("INFO", logger="hypura.serve"):
        held = Held(server.url, copies.engines[0])
        try:
            _replace(smol, smollm2_path)
            assert _short(c).status_code == 200  # the new file loaded beside the copy serving `held`
            assert copies.loads == 2 and copies.open == 2
            _replace(smol, smollm2_path)
            later = {}

            def wait():
                with httpx.Client(base_url=server.url, timeout=WAIT_S) as other:
                    later["r"] = _short(other)

            waiter = threading.Thread(target=wait)
            waiter.start()
            _until(lambda: "changed again while the copy loaded before still serves" in caplog.text, "the wait")
            assert copies.loads == 2 and "r" not in later  # no third copy while the first one serves
        finally:
            held.finish()  # the held request runs to its end on the first copy
        waiter.join(WAIT_S)
        assert "r" in later and later["r"].status_code == 200, later.get("r")
        assert held.chunks > 1 and copies.loads == 3 and copies.most == 2
        _until(lambda: copies.open == 1, "the second copy closed")  # idle once the waiter's request ended
        assert _short(c).status_code == 200 and copies.loads == 3


def test_the_wait_for_a_retired_copy_is_bounded(served, smol, smollm2_path, monkeypatch):
    server, copies = served
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as c:
        held = Held(server.url, copies.engines[0])
        try:
            _replace(smol, smollm2_path)
            assert _short(c).status_code == 200
            _replace(smol, smollm2_path)
            wait_s = registry_module.LOAD_WAIT_S
            monkeypatch.setattr(registry_module, "LOAD_WAIT_S", 1)  # the loads above bounded as the server's
            r = _short(c)
            assert r.status_code == 503 and r.headers["Retry-After"] == "10", r.text
            assert "its file changed again" in r.json()["error"]["message"] and copies.loads == 2
        finally:
            held.finish()
        monkeypatch.setattr(registry_module, "LOAD_WAIT_S", wait_s)
        assert _short(c).status_code == 200 and copies.loads == 3 and copies.most == 2
