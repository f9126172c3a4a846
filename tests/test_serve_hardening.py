"""A server you can leave running (issue 33), over HTTP against a stand-in engine: closed to other web
origins and to DNS rebinding (Host, Origin, CORS as Ollama since CVE-2024-28224), every client mistake a
4xx with no traceback in the log, slow clients dropped, streams ended with an error chunk at shutdown, the
Bearer scheme read in any case."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from serve_fakes import MODEL, FakeEngine, ndjson_lines, sse_events, start_fake  # noqa: E402
from serve_helpers import free_port, wait_ready  # noqa: E402

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": False}


@pytest.fixture(scope="module")
def server(smollm2_path):
    s = start_fake(smollm2_path, cors_origins=("https://app.example", "http://192.168.1.5:*"),
                   allowed_hosts=("ollama.lan",))
    yield s
    s.stop()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


@pytest.fixture
def log_lines(caplog):
    caplog.set_level(logging.INFO)
    return caplog


def _no_traceback(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()], \
        [r.getMessage() for r in caplog.records]


# --- Host and Origin ---------------------------------------------------------------------------------
@pytest.mark.parametrize("host,status", [("127.0.0.1:11434", 200), ("localhost", 200), ("LOCALHOST:1", 200),
                                         ("[::1]:11434", 200), ("app.localhost", 200), ("ollama.lan:80", 200),
                                         ("rebind.evil.example", 403), ("192.168.1.9", 403)])
def test_host_allow_list(client, host, status):
    """A DNS-rebinding page reaches 127.0.0.1 under its own name: refused, before any work."""
    before = len(client.get("/api/tags").json()["models"])
    r = client.get("/api/tags", headers={"Host": host})
    assert r.status_code == status, r.text
    if status == 403:
        assert "Host" in r.json()["error"] and "--allowed-hosts" in r.json()["error"]
    assert before == 1


def test_any_ip_is_answered_when_listening_on_every_address():
    from hypura.serve.http.origins import Origins

    o = Origins("0.0.0.0")
    assert o.host_allowed("192.168.1.9:11434") and o.host_allowed("[fe80::1]:80")
    assert not o.host_allowed("rebind.evil.example")
    assert Origins("127.0.0.1", allowed_hosts=("*",)).host_allowed("anything.example")
    assert Origins("myhost.lan").host_allowed("MyHost.lan:11434")


def test_a_foreign_origin_is_refused_before_any_work(server, client):
    n = len(server.engine.submitted)
    # a web page's no-preflight POST: text/plain body
    r = client.post("/api/generate", content=json.dumps({"model": MODEL, "prompt": "x"}),
                    headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert r.status_code == 403 and "--cors-origin" in r.json()["error"]
    assert "access-control-allow-origin" not in r.headers
    r = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "null"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert len(server.engine.submitted) == n  # nothing reached the engine


@pytest.mark.parametrize("path,body", [
    ("/api/embed", {"model": MODEL, "input": "x"}), ("/api/embeddings", {"model": MODEL, "prompt": "x"}),
    ("/v1/embeddings", {"model": MODEL, "input": "x"}),
    ("/api/chat", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "format": "json"})])
def test_the_client_features_routes_are_guarded_too(server, client, path, body):
    n = len(server.engine.submitted)
    assert client.post(path, json=body, headers={"Host": "rebind.evil.example"}).status_code == 403
    assert client.post(path, json=body, headers={"Origin": "https://evil.example"}).status_code == 403
    assert len(server.engine.submitted) == n


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1", "https://app.example",
                                    "http://192.168.1.5:8080", "tauri://localhost", "vscode-webview://abc"])
def test_allowed_origins_get_cors_headers(client, origin):
    r = client.post("/api/chat", json=CHAT, headers={"Origin": origin})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    assert "Origin" in r.headers["vary"]
    # the preflight a browser sends before a JSON POST with a key
    r = client.options("/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == origin
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"


def test_preflight_of_a_foreign_origin_is_refused(client):
    r = client.options("/api/chat", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


def test_cors_any_origin(smollm2_path):
    s = start_fake(smollm2_path, cors_origins=("*",))
    try:
        r = httpx.get(s.url + "/api/tags", headers={"Origin": "https://anything.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://anything.example"
    finally:
        s.stop()


# --- the API key ---------------------------------------------------------------------------------------
def test_bearer_scheme_in_any_case(smollm2_path):
    s = start_fake(smollm2_path, api_key="k3y")
    try:
        for value, status in (("Bearer k3y", 200), ("bearer k3y", 200), ("BEARER  k3y", 200),
                              ("Bearer K3Y", 401), ("Basic k3y", 401), ("k3y", 401), ("bearer", 401)):
            r = httpx.get(s.url + "/api/tags", headers={"Authorization": value})
            assert r.status_code == status, value
    finally:
        s.stop()


# --- client mistakes: a 4xx, one line, no traceback ----------------------------------------------------
@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
@pytest.mark.parametrize("body,word", [
    ('{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}]}' % MODEL, "surrogate"),
    ('{"model": "%s", "messages": [{"role": "\\udfff", "content": "x"}]}' % MODEL, "surrogate"),
    ('{"model": "%s", "x": ' % MODEL + "[" * 100_000 + "]" * 100_000 + "}", "nested"),
    ('{"model": "%s", "x": ' % MODEL + "[" * 100 + "]" * 100 + "}", "nested"),
    ('{"model": "%s", "seed": ' % MODEL + "9" * 5000 + "}", "number"),
])
def test_malformed_bodies_are_400(client, log_lines, path, body, word):
    r = client.post(path, content=body.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"] if path.startswith("/v1") else r.json()["error"]
    assert word in message and "\n" not in message
    _no_traceback(log_lines)


def test_an_8mb_chat_prompt_is_400(client, log_lines):
    started = time.monotonic()
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * ((8 << 20) - 200)}]}
    r = client.post("/api/chat", json=big)
    assert r.status_code == 400 and "context" in r.json()["error"], r.text[:300]
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * ((8 << 20) - 200)})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert time.monotonic() - started < 10
    _no_traceback(log_lines)


def test_too_many_messages_for_the_context_is_400(client):
    r = client.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "a"}] * 100_000})
    assert r.status_code == 400 and "messages" in r.json()["error"]


def test_a_client_leaving_mid_body_is_one_line(server, log_lines):
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"model\": ")
        time.sleep(0.2)
        s.close()
    deadline = time.monotonic() + 5
    while len([r for r in log_lines.records if "left before sending its whole body" in r.getMessage()]) < 3:
        assert time.monotonic() < deadline, [r.getMessage() for r in log_lines.records]
        time.sleep(0.05)
    _no_traceback(log_lines)
    assert httpx.get(server.url + "/health").status_code == 200


# --- slow clients -----------------------------------------------------------------------------------
def test_slow_headers_and_slow_bodies_are_dropped(smollm2_path):
    s = start_fake(smollm2_path, timeout_s=1.0)
    try:
        slow = []
        for _ in range(20):  # slowloris: headers that never end, a byte now and then
            c = socket.create_connection(("127.0.0.1", s.port))
            c.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            slow.append(c)
        unread = socket.create_connection(("127.0.0.1", s.port))  # refused, then its body dripped for ever
        unread.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\n"
                       b"Content-Length: 100000\r\n\r\n{")
        slow.append(unread)
        body = socket.create_connection(("127.0.0.1", s.port))  # a body that never ends
        body.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{")
        started = time.monotonic()
        for c in slow[:5]:
            c.sendall(b"X-A: b\r\n")
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200  # served meanwhile
        unread.settimeout(10)
        assert b" 403 " in unread.recv(1000)
        for c in slow[:5] + [unread]:  # the dripping goes on after the answer
            c.sendall(b"x")
        for c in slow:
            c.settimeout(10)
            while c.recv(1000):  # closed by the server (after the 403, for the unread body)
                pass
        body.settimeout(10)
        answer = b""
        while b"--timeout" not in answer and (chunk := body.recv(1000)):
            answer += chunk
        assert b" 408 " in answer and b"--timeout" in answer
        assert time.monotonic() - started < 8
    finally:
        s.stop()


# --- shutdown ---------------------------------------------------------------------------------------
def test_shutdown_ends_every_stream_with_an_error_chunk(smollm2_path, log_lines):
    engine = FakeEngine(parallel=8, max_queue=8, token_s=0.01, default_len=100_000)
    s = start_fake(smollm2_path, engine=engine)
    results = {}

    ended = {}

    def stream(name, path, body):
        with httpx.Client(base_url=s.url, timeout=30) as c:
            results[name] = c.post(path, json=body)
            ended[name] = time.monotonic()

    bodies = {"ndjson": ("/api/chat", {**CHAT, "stream": True}),
              "sse": ("/v1/chat/completions", {**CHAT, "stream": True}),
              "sse-completions": ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": True}),
              "whole": ("/api/generate", {"model": MODEL, "prompt": "x", "stream": False})}
    threads = [threading.Thread(target=stream, args=(k, *v)) for k, v in bodies.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len(engine.active) < len(bodies):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)
    started = time.monotonic()
    s.stop()
    stop_s = time.monotonic() - started
    for t in threads:
        t.join(10)
    assert max(ended.values()) - started < 4, ended  # each answer ended within the grace period (5 s)
    assert stop_s < 10, stop_s  # then the engines and models are closed
    assert ndjson_lines(results["ndjson"])[-1] == {"error": "the server is shutting down"}
    for name in ("sse", "sse-completions"):
        events = sse_events(results[name])
        assert events[-1] == "[DONE]" and events[-2]["error"]["message"] == "the server is shutting down"
    assert results["whole"].status_code == 503
    assert all(r.cancelled.is_set() or r._done.is_set() for r in engine.submitted)
    _no_traceback(log_lines)
    assert not [r for r in log_lines.records if "CancelledError" in r.getMessage()]


def test_sigterm_ends_open_streams_and_exits_within_the_grace(tmp_path):
    """`hypura serve` with the default model and streams open: SIGTERM ends each with an error chunk
    (SSE: then [DONE]) within the grace period, exits 0, and logs no traceback."""
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hypura.cli.main", "serve", "--port", str(port), "-np", "2",
                             "-c", "256", "-t", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HYPURA_API_KEY": ""})
    url, results = f"http://127.0.0.1:{port}", {}
    try:
        wait_ready(proc, url, 90)
        model = httpx.get(url + "/api/tags").json()["models"][0]["name"]
        # a reply that runs to the context (~6 s on one quiet thread): still streaming when SIGTERM comes
        ask = "Write the numbers from 1 to 1000, separated by commas."
        long = {"model": model, "messages": [{"role": "user", "content": ask}], "stream": True,
                "options": {"num_predict": 10_000, "temperature": 0, "repeat_penalty": 1.0}, "max_tokens": 10_000,
                "temperature": 0}

        ended = {}

        def stream(name, path):
            with httpx.Client(base_url=url, timeout=60) as c, c.stream("POST", path, json=long) as r:
                results[name] = "".join(r.iter_text())
                ended[name] = time.monotonic()

        threads = [threading.Thread(target=stream, args=(n, p)) for n, p in
                   (("ndjson", "/api/chat"), ("sse", "/v1/chat/completions"))]
        for t in threads:
            t.start()
        time.sleep(3)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - started
        for t in threads:
            t.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert max(ended.values()) - started < 5, ended  # the streams ended within the grace period
    assert took < 20, took  # then the models were closed and the process exited (a busy 2-core machine)
    assert results["ndjson"].rstrip().endswith('{"error":"the server is shutting down"}'), results["ndjson"][-300:]
    assert results["sse"].rstrip().endswith("data: [DONE]") and "shutting down" in results["sse"][-300:]
    assert "Traceback" not in err and "CancelledError" not in err, err[-2000:]
