"""`hypura serve` as a user runs it: a subprocess on 127.0.0.1 with the default model, /health 503 then 200,
the API key (raw HTTP, the ollama and openai clients), Ctrl-C; and its one-line failures (a bad model
file, a taken port)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from serve_helpers import MODEL  # noqa: E402

HYPURA = [sys.executable, "-m", "hypura.cli.main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*HYPURA, "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HYPURA_API_KEY": ""})


@pytest.mark.slow
def test_serve_runs_answers_and_stops_on_ctrl_c():
    port = _free_port()
    proc = _serve("--port", str(port), "-np", "2", "-c", "256", "-t", "1", "--api-key", "k3y", "--log-level", "warning")
    url = f"http://127.0.0.1:{port}"
    try:
        seen, deadline = set(), time.monotonic() + 60
        while 200 not in seen:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "not ready in 60 s"
            try:
                seen.add(httpx.get(url + "/health").status_code)  # no key needed
            except httpx.ConnectError:
                pass
            time.sleep(0.05)
        assert seen <= {200, 503}
        assert httpx.get(url + "/api/tags").status_code == 401
        r = httpx.post(url + "/api/generate", headers={"Authorization": "Bearer k3y"}, timeout=60,
                       json={"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 3}})
        assert r.status_code == 200 and r.json()["done"]
        _clients_with_the_key(url)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"listening on {url}" in err


def _clients_with_the_key(url: str) -> None:
    ollama = pytest.importorskip("ollama")
    openai = pytest.importorskip("openai")
    assert [m.model for m in ollama.Client(host=url, headers={"Authorization": "Bearer k3y"}).list().models] == [MODEL]
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=url).list()
    assert e.value.status_code == 401
    assert [m.id for m in openai.OpenAI(base_url=url + "/v1", api_key="k3y").models.list().data] == [MODEL]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_a_model_that_fails_to_load_is_one_line(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    proc = _serve("-m", str(bad), "--port", "0", "--log-level", "warning")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "broken.gguf" in line[0] and "GGUF" in line[0]
    assert "Traceback" not in err


def test_a_taken_port_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = _serve("--port", str(port))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and f"error: cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_threads_batch_flag():
    from hypura.cli.serve_cmd import _threads

    out = subprocess.run([*HYPURA, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "-tb, --threads-batch" in out
    assert _threads(1, None) == {"n_threads": 1} and _threads(1, 2) == {"n_threads": 1, "n_threads_batch": 2}
