"""The real server (real engine, default model) under load and abuse: 64 concurrent clients of both APIs,
some leaving mid-stream; clients that disconnect; a full queue; error bodies; time to first token.
Each ends with the engine idle: no request, sequence or queue entry left behind."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from serve_helpers import MODEL, engine_of, openai_client, real_server, serving, wait_idle  # noqa: E402

CLIENTS = 64
LOAD_LIMIT_S = 60  # the whole load test, on 2 busy cores
GENERATED = 16  # tokens a staying client asks for
LEAVER_ASKS = 400  # tokens a leaving client asks for: if its request outlived it, the test would take minutes


@pytest.fixture(scope="module")
def server(smollm2_path):
    yield from serving(smollm2_path, parallel=4, n_ctx=512)


def _request(i: int, leaves: bool) -> tuple[str, dict, bool]:
    """(path, body, streams) of client i: the four kinds of generation in turn."""
    n = LEAVER_ASKS if leaves else GENERATED
    messages = [{"role": "user", "content": f"Tell me one fact about the number {i}."}]
    kind = i % 4
    if kind == 0:
        return "/api/chat", {"model": MODEL, "messages": messages, "options": {"num_predict": n, "seed": i}}, True
    if kind == 1:
        return "/api/generate", {"model": MODEL, "prompt": f"Count to {i}:", "stream": leaves,
                                 "options": {"num_predict": n, "seed": i}}, leaves
    if kind == 2:
        return "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": n, "seed": i,
                                        "stream": True, "stream_options": {"include_usage": True}}, True
    return "/v1/completions", {"model": MODEL, "prompt": f"The number {i} is", "max_tokens": n, "seed": i,
                               "stream": leaves}, leaves


def _generated(path: str, streamed: bool, text: str) -> int:
    """Tokens generated, from the response's own counts (Ollama's eval_count, OpenAI's usage)."""
    if path.startswith("/api/"):
        last = json.loads(text.strip().splitlines()[-1])
        assert last["done"] and last["done_reason"] in ("stop", "length"), last
        return last["eval_count"]
    if streamed:
        events = [b[len("data: "):] for b in text.split("\n\n") if b.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return json.loads(events[-2])["usage"]["completion_tokens"]
    body = json.loads(text)
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    return body["usage"]["completion_tokens"]


async def _client(url: str, i: int, leaves: bool, started: float) -> dict:
    path, body, streams = _request(i, leaves)
    async with httpx.AsyncClient(base_url=url, timeout=LOAD_LIMIT_S) as client:
        sent = time.monotonic()
        if leaves:  # read the first chunk, then hang up
            async with client.stream("POST", path, json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    break
            return {"left": True}
        r = await client.post(path, json=body)
        assert r.status_code == 200, r.text
        return {"left": False, "tokens": _generated(path, streams, r.text), "latency": time.monotonic() - sent,
                "end": time.monotonic() - started}


@pytest.mark.slow
def test_64_concurrent_clients_some_leaving(server):
    engine = engine_of(server)
    before = wait_idle(engine)
    leavers = {i for i in range(CLIENTS) if i % 8 in (0, 2)}  # streaming kinds: one in four clients leaves

    async def run():
        started = time.monotonic()
        results = await asyncio.gather(*(_client(server.url, i, i in leavers, started) for i in range(CLIENTS)))
        return results, time.monotonic() - started

    results, elapsed = asyncio.run(run())
    assert elapsed < LOAD_LIMIT_S
    stayed = [r for r in results if not r["left"]]
    assert len(stayed) == CLIENTS - len(leavers)
    after = wait_idle(engine)
    finished = {k: after["requests"]["by_reason"][k] - before["requests"]["by_reason"][k]
                for k in after["requests"]["by_reason"]}
    assert finished["cancelled"] == len(leavers) and finished["error"] == 0
    assert finished["stop"] + finished["length"] == len(stayed)
    assert httpx.get(server.url + "/health").status_code == 200
    tokens = sum(r["tokens"] for r in stayed)
    print(f"\nload: {CLIENTS} clients ({len(leavers)} left mid-stream) in {elapsed:.1f} s: "
          f"{len(stayed) / elapsed:.2f} requests/s, {tokens / elapsed:.1f} generated tok/s aggregate, "
          f"latency median {statistics.median(r['latency'] for r in stayed):.1f} s; engine decode "
          f"{after['decode_tok_s']:.1f} tok/s, prefill {after['prefill_tok_s']:.1f} tok/s, "
          f"cached prompt tokens {after['cached_tokens'] - before['cached_tokens']}")


def _raw(port: int, path: str, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


@pytest.mark.parametrize("path,body", [
    # a reply the model ended on its own before the client left would not be cancelled: greedy, this one runs
    # to LEAVER_ASKS tokens (Ollama has no ignore_eos)
    ("/api/chat", {"messages": [{"role": "user", "content": "Write a long story about a dragon."}],
                   "options": {"num_predict": LEAVER_ASKS, "temperature": 0}}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": LEAVER_ASKS, "stream": False,
                         "ignore_eos": True})])
def test_a_client_that_leaves_frees_its_sequence(server, path, body):
    engine = engine_of(server)
    before = wait_idle(engine)
    s = _raw(server.port, path, {"model": MODEL, **body})
    deadline = time.monotonic() + 10
    while engine.metrics()["generated_tokens"] - before["generated_tokens"] < 2:  # it runs
        assert time.monotonic() < deadline
        time.sleep(0.02)
    s.close()
    after = wait_idle(engine, timeout=2)  # freed within 2 s of the hang-up, not after LEAVER_ASKS tokens
    assert after["requests"]["by_reason"]["cancelled"] == before["requests"]["by_reason"]["cancelled"] + 1
    # how many tokens 2 s hold depends on the machine's load (up to ~200 seen on 2 busy cores): only not all
    assert after["generated_tokens"] - before["generated_tokens"] < LEAVER_ASKS


def test_errors_from_the_real_engine(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "word " * 600}]})
        assert r.status_code == 400 and "context" in r.json()["error"]
        long_chat = [{"role": "user", "content": "word " * 600}]
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": long_chat})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = c.post("/v1/completions", content=b'{"model": ', headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = c.post("/api/generate", json={"model": "qwen:7b", "prompt": "x"})
        assert r.status_code == 404 and "not found" in r.json()["error"]
        r = c.post("/api/generate", json={"model": MODEL, "prompt": "x", "options": {"top_p": -1}})
        assert r.status_code == 400 and "top_p" in r.json()["error"]
        r = c.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False,
                                          "options": {"num_predict": 3}})
        assert r.status_code == 200 and r.json()["eval_count"] <= 3  # and it goes on serving
    wait_idle(engine_of(server))


def test_metrics_report_the_engine(server):
    text = httpx.get(server.url + "/metrics").text
    for name in ("hypura_engine_requests_total", "hypura_engine_requests_active", "hypura_engine_requests_queued",
                 "hypura_engine_decode_tok_s", "hypura_engine_generated_tokens", "hypura_engine_llm_decode_tok_s",
                 "hypura_engine_llm_decode_stall_ms_per_token", "hypura_engine_llm_memory_rss"):
        assert f'{name}{{model="{MODEL}"}} ' in text, name
    assert "# TYPE hypura_engine_requests_total counter" in text
    series = [line.split(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(series) == len(set(series))  # Prometheus refuses a series twice


def test_time_to_first_token(server):
    pytest.importorskip("openai")
    client = openai_client(server)
    wait_idle(engine_of(server))
    ttft = []
    for i in range(5):
        started = time.monotonic()
        for chunk in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Hi {i}"}],
                                                    max_tokens=4, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                ttft.append(time.monotonic() - started)
                break
    assert len(ttft) == 5
    print(f"\ntime to first token (short chat prompt, idle server): median {statistics.median(ttft) * 1000:.0f} ms, "
          f"min {min(ttft) * 1000:.0f} ms")
    wait_idle(engine_of(server))


def test_a_full_queue_answers_429_and_the_server_goes_on(smollm2_path):
    server = real_server(smollm2_path, parallel=1, n_ctx=512, max_queue=1)
    engine = engine_of(server)
    try:
        body = {"model": MODEL, "prompt": "Once upon a time", "raw": True, "options": {"num_predict": LEAVER_ASKS}}
        running = _raw(server.port, "/api/generate", body)
        deadline = time.monotonic() + 10
        while engine.metrics()["requests"]["active"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        waiting = _raw(server.port, "/api/generate", body)
        while engine.metrics()["requests"]["queued"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with httpx.Client(base_url=server.url, timeout=30) as c:
            r = c.post("/api/generate", json=body)
            assert r.status_code == 429 and r.json()["error"] and r.headers["retry-after"]
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
            running.close()
            waiting.close()
            wait_idle(engine, timeout=5)
            r = c.post("/api/generate", json={**body, "stream": False, "options": {"num_predict": 2}})
            assert r.status_code == 200 and r.json()["done"]
            assert c.get("/health").status_code == 200
    finally:
        server.stop()
