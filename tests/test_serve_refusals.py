"""What the server refuses, over HTTP against a stand-in engine: malformed bodies, unknown models, bad
options, prompts over the context, a full queue, oversized bodies, unknown routes, broken and hostile
chat templates, requests while loading, a missing API key; and clients that disconnect. Each answer
is a 4xx/5xx in the API's own error shape, and the server goes on serving."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from serve_fakes import MODEL, start_fake, wait_ready  # noqa: E402


@pytest.fixture(scope="module")
def server(smollm2_path):
    s = start_fake(smollm2_path)
    yield s
    s.stop()


@pytest.fixture
def client(server):
    server.engine.fail_after = None
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


# --- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path,openai", [("/api/generate", False), ("/v1/completions", True)])
def test_malformed_json_and_unknown_model(client, path, openai):
    for body in (b"{not json", b"[1, 2]", b""):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert isinstance(r.json()["error"]["message"] if openai else r.json()["error"], str)
    r = client.post(path, json={"model": "/etc/passwd", "prompt": "x"})
    assert r.status_code == 404
    message = r.json()["error"]["message"] if openai else r.json()["error"]
    assert "not found" in message and MODEL in message
    if openai:
        assert r.json()["error"]["type"] == "not_found_error" and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("options,word", [
    ({"temperature": "hot"}, "temperature"), ({"top_p": 2}, "top_p"), ({"num_predict": 0}, "num_predict"),
    ({"mirostat": 2}, "mirostat"), ({"stop": [1, 2]}, "stop"), ({"seed": 1.5}, "seed"), ({"top_k": -1}, "top_k")])
def test_bad_options(client, options, word):
    r = client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "options": options})
    assert r.status_code == 400 and word in r.json()["error"]


@pytest.mark.parametrize("body,word", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": 3}, "temperature"), ({"n": 9}, "'n'"),
    ({"n": 2, "stream": True}, "'n'"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"response_format": {"type": "xml"}}, "response_format"), ({"response_format": {"type": "json_schema",
     "json_schema": {"schema": {"type": "object", "properties": {"a": {"$ref": "https://x/y"}}}}}}, "response_format"),
    ({"grammar": "x", "response_format": {"type": "json_object"}}, "grammar"),
    ({"messages": []}, "messages"), ({"messages": [{"content": "x"}]}, "role"),
    ({"tools": [{"type": "function"}]}, "tools"), ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"function": {"name": "g"}}},
     "tool_choice"), ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}],
                      "tool_choice": "required"}, "tools")])
def test_bad_openai_fields(client, body, word):
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                  **body})
    assert r.status_code == 400 and word in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,word", [({"images": ["aGk="]}, "support"), ({"think": True}, "support thinking"),
                                       ({"format": "xml"}, "format"), ({"format": {"type": "wat"}}, "format"),
                                       ({"tools": [{"type": "function"}]}, "tools[0]")])
def test_unsupported_ollama_features_say_so(client, body, word):
    r = client.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], **body})
    assert r.status_code == 400 and word in r.json()["error"] and "\n" not in r.json()["error"]


def test_prompt_longer_than_the_context(client):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 600})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = client.post("/api/generate", json={"model": MODEL, "prompt": "x" * 600, "raw": True})
    assert r.status_code == 400 and "601 tokens" in r.json()["error"]  # BOS + 600 bytes


def test_token_ids_outside_the_vocabulary(client):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": [1, 10 ** 9]})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    r = client.post("/api/generate", json={"model": MODEL, "prompt": "x", "context": [-1]})
    assert r.status_code == 400


def test_too_many_requests_get_429_and_the_server_goes_on(client, server):
    engine = server.engine
    engine.token_s = 0.05
    try:
        with httpx.Client(base_url=server.url, timeout=10) as slow:
            threads = [threading.Thread(target=slow.post, args=("/api/generate",),
                                        kwargs={"json": {"model": MODEL, "prompt": "x", "stream": False,
                                                         "options": {"num_predict": 10}}}) for _ in range(4)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 5
            while len(engine.active) < engine.parallel + engine.max_queue and time.monotonic() < deadline:
                time.sleep(0.01)
            r = client.post("/api/generate", json={"model": MODEL, "prompt": "x"})
            assert r.status_code == 429 and r.headers["retry-after"] and "busy" in r.json()["error"]
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
            for t in threads:
                t.join()
    finally:
        engine.token_s = 0.002
    assert client.post("/api/generate", json={"model": MODEL, "prompt": "x", "stream": False}).status_code == 200


def test_body_size_is_bounded(smollm2_path):
    server = start_fake(smollm2_path, max_body_bytes=4096)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            big = {"model": MODEL, "prompt": "x" * 5000}
            r = c.post("/api/generate", json=big)
            assert r.status_code == 413 and "4096" in r.json()["error"]

            def chunked():  # no Content-Length: counted as it arrives
                yield json.dumps(big).encode()

            r = c.post("/v1/completions", content=chunked())
            assert r.status_code == 413 and r.json()["error"]["message"]
            assert c.get("/health").status_code == 200
    finally:
        server.stop()


def test_unknown_route_and_method(client):
    r = client.get("/api/nothing")
    assert r.status_code == 404 and "no route" in r.json()["error"]
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_routes_not_offered_say_why(client):
    r = client.post("/api/pull", json={"model": "llama3"})
    assert r.status_code == 501 and "hypura serve -m" in r.json()["error"]
    r = client.post("/v1/embeddings", json={"model": MODEL, "input": "x", "dimensions": 3})
    assert r.status_code == 400 and "dimensions" in r.json()["error"]["message"]


@pytest.mark.slow
def test_template_failures(smollm2_path):
    for template, status, word in (("{% if %}", 500, "does not parse"),
                                   ("{{ raise_exception('roles must alternate') }}", 400, "roles must alternate"),
                                   ("{{ ''.__class__.__mro__ }}", 500, "unsafe"),
                                   ("{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}",
                                    500, "range")):
        server = start_fake(smollm2_path, template=template)
        try:
            with httpx.Client(base_url=server.url, timeout=10) as c:
                chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
                r = c.post("/api/chat", json=chat)
                assert r.status_code == status and word in r.json()["error"], r.text
                r = c.post("/v1/chat/completions", json=chat)
                assert r.status_code == status and word in r.json()["error"]["message"]
                assert c.post("/api/generate", json={"model": MODEL, "prompt": "x", "raw": True,
                                                     "stream": False}).status_code == 200
        finally:
            server.stop()


def test_health_is_503_while_loading(smollm2_path):
    gate = threading.Event()
    server = start_fake(smollm2_path, gate=gate)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            r = c.get("/health")
            assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
            assert c.post("/api/generate", json={"model": MODEL, "prompt": "x"}).status_code == 503
            gate.set()
            wait_ready(server)
            assert c.get("/health").status_code == 200
    finally:
        gate.set()
        server.stop()


# --- disconnects ------------------------------------------------------------------------------------
def _raw_request(port: int, path: str, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


@pytest.mark.parametrize("path,body", [
    ("/api/generate", {"prompt": "x"}), ("/api/chat", {"messages": [{"role": "user", "content": "x"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True}),
    ("/api/generate", {"prompt": "x", "stream": False}), ("/v1/completions", {"prompt": "x"})])
def test_a_client_that_leaves_cancels_its_request(server, path, body):
    engine = server.engine
    engine.default_len = 10_000
    try:
        n = len(engine.submitted)
        s = _raw_request(server.port, path, {"model": MODEL, "options": {"num_predict": -1}, **body})
        deadline = time.monotonic() + 5
        while len(engine.submitted) == n:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        if body.get("stream", True) and path != "/v1/completions":
            assert s.recv(4096).startswith(b"HTTP/1.1 200")  # streaming began
        s.close()
        assert engine.submitted[-1].cancelled.wait(2), "the engine request outlived its client"
    finally:
        engine.default_len = 8


# --- auth -------------------------------------------------------------------------------------------
def test_api_key(smollm2_path):
    server = start_fake(smollm2_path, api_key="s3cret")
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.get("/health").status_code == 200  # open: probes carry no key
            for path in ("/", "/api/tags", "/v1/models", "/metrics"):
                r = c.get(path)
                assert r.status_code == 401, path
            r = c.get("/v1/models", headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            assert "API key" in c.get("/api/tags").json()["error"]
            ok = {"Authorization": "Bearer s3cret"}
            assert c.get("/api/tags", headers=ok).status_code == 200
            assert c.post("/v1/completions", headers=ok, json={"model": MODEL, "prompt": "x"}).status_code == 200
    finally:
        server.stop()
