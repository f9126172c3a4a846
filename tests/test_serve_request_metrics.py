"""Each request's figures, as a person reads them: one log line per request once its answer has ended (its
route, status and time; for generation its model, prompt tokens and how many were reused, the prompt's and
the decode's rates, queue wait, time to first token), and /metrics' per-request summaries (quantiles, sums,
counts) and reused-token totals. A real HTTP client against the real server and the default model."""

from __future__ import annotations

import logging
import re
import time

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from serve_helpers import MODEL, serving  # noqa: E402

ASK = [{"role": "user", "content": "Name three planets of the solar system."}]
LINE = re.compile(r"^127\.0\.0\.1:\d+ POST /v1/chat/completions 200 [\d.]+ s \| " + re.escape(MODEL) +
                  r" (stop|length): prompt (\d+) tokens \((\d+) cached, (\d+) at \d+ tok/s\), (\d+) generated at "
                  r"[\d.]+ tok/s, queued [\d.]+ s, first token [\d.]+ s$")


@pytest.fixture(scope="module")
def server(smollm2_path):
    yield from serving(smollm2_path, n_ctx=1024)


def _lines(caplog, needle: str, n: int) -> list[str]:
    """The server's lines holding `needle`, once there are `n` (a line is written when its answer has ended,
    after the client has read it)."""
    for _ in range(500):
        lines = [r.getMessage() for r in caplog.records if needle in r.getMessage()]
        if len(lines) >= n:
            return lines
        time.sleep(0.01)
    return lines


def test_one_log_line_per_request_with_what_it_cost(server, caplog):
    caplog.set_level(logging.INFO)
    with httpx.Client(base_url=server.url, timeout=120) as c:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 12, "temperature": 0}
        first = c.post("/v1/chat/completions", json=body).json()
        history = ASK + [first["choices"][0]["message"], {"role": "user", "content": "And one more?"}]
        with c.stream("POST", "/v1/chat/completions", json={**body, "messages": history, "stream": True}) as r:
            r.read()
        assert c.get("/health").status_code == 200
    lines = _lines(caplog, "POST /v1/chat/completions", 2)
    assert len(lines) == 2, lines
    turns = [LINE.match(line) for line in lines]
    assert all(turns), lines
    usage = first["usage"]
    assert int(turns[0][2]) == usage["prompt_tokens"] and int(turns[0][5]) == usage["completion_tokens"]
    prompt, cached, evaluated = (int(turns[1][k]) for k in (2, 3, 4))
    assert cached >= first["usage"]["prompt_tokens"] and evaluated == prompt - cached  # the second turn reused
    health = _lines(caplog, "GET /health", 1)
    assert len(health) == 1 and re.match(r"^127\.0\.0\.1:\d+ GET /health 200 [\d.]+ s$", health[0]), health
    assert not [r for r in caplog.records if r.name.startswith("uvicorn")]  # uvicorn's access line is off


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_give_each_requests_figures(server):
    label = f'model="{MODEL}"'
    with httpx.Client(base_url=server.url, timeout=120) as c:
        before = _samples(c.get("/metrics").text)
        body = {"model": MODEL, "messages": ASK, "max_tokens": 8, "temperature": 0}
        usages = [c.post("/v1/chat/completions", json=body).json()["usage"] for _ in range(3)]
        for _ in range(500):  # the figures are added when each answer has ended, after the client read it
            metrics = c.get("/metrics")
            after = _samples(metrics.text)
            total = f"hypura_request_total{{{label}}}"
            if after.get(total, 0) - before.get(total, 0) >= 3:
                break
            time.sleep(0.01)
    assert "# TYPE hypura_request_time_to_first_token_seconds summary" in metrics.text
    for name in ("queue_seconds", "time_to_first_token_seconds", "decode_tok_s"):
        full = f"hypura_request_{name}"
        assert after[f"{full}_count{{{label}}}"] - before.get(f"{full}_count{{{label}}}", 0) == 3, name
        for q in ("0.5", "0.9", "0.99"):
            assert after[f'{full}{{{label},quantile="{q}"}}'] >= 0
    assert after[f'hypura_request_decode_tok_s{{{label},quantile="0.5"}}'] > 0
    assert after[f'hypura_request_time_to_first_token_seconds{{{label},quantile="0.5"}}'] > 0
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached > 0  # the same prompt again: its KV is reused
    name = f"hypura_request_cached_tokens_total{{{label}}}"
    assert after[name] - before.get(name, 0) == cached
    name = f"hypura_request_prompt_tokens_total{{{label}}}"
    assert after[name] - before.get(name, 0) == sum(u["prompt_tokens"] for u in usages)
