"""Tokenizing a prompt is bounded (issue 33): llama.cpp's special-token split is quadratic in the special
tokens of a text (`"<|im_end|>x" * 32k` took 20 s, 100k one-character chat messages over 5 minutes, and
SIGTERM waited on it); the server tokenizes in pieces with the same tokens, refuses what cannot fit the
context before tokenizing it, stops when the tokens fill the context or the request goes, and shuts down
without waiting on a tokenization."""

from __future__ import annotations

import threading
import time

import pytest

import hypura
from hypura.serve.models import prompt_tokens

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from serve_fakes import MODEL, FakeEngine, start_fake  # noqa: E402
from serve_helpers import health_probed, real_server  # noqa: E402


@pytest.fixture(scope="module")
def llm(smollm2_path):
    model = hypura.Llama(str(smollm2_path), n_ctx=256, n_threads=1, verbose=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def vocab(llm):
    return prompt_tokens.read_vocab(llm)


def _whole(llm, text, add_special, special):
    return llm.tokenize(text.encode(), add_bos=add_special, special=special)


def _pieces(llm, vocab, text, add_special, special=True, n_ctx=10 ** 7, cancelled=None):
    return prompt_tokens.tokenize(lambda t, a, s: _whole(llm, t, a, s), vocab, text, add_special, special, n_ctx,
                                  cancelled or threading.Event())


def test_the_vocabulary(vocab):
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= vocab.cutters
    assert 16 <= vocab.max_token_bytes <= 1024 and not vocab.adds_eos


TURN = "<|im_start|>user\nna\u00efve caf\u00e9 \u2615 {i}  spaces\t<|im_end|>\n<|im_start|>assistant\n<|im_end|> x"
TEXTS = {
    "turns": "".join(TURN.format(i=i) for i in range(400)),
    "special-x": "<|im_end|>x" * 3000,
    "no-specials": "word " * 3000,
    "adjacent": "<|im_start|><|im_end|>" * 500 + "tail",
    "lookalikes": "<|im_end|" * 500 + "<|im_end|>" + "|im_end|>" * 500,
    "unicode": ("\U0001F600<|im_end|>\u00e9" * 700),
}


@pytest.mark.parametrize("name", list(TEXTS))
@pytest.mark.parametrize("add_special", [True, False])
def test_pieces_give_llama_cpps_tokens(llm, vocab, name, add_special):
    text = TEXTS[name]
    assert len(text) > 2 * prompt_tokens.PIECE_CHARS
    assert _pieces(llm, vocab, text, add_special) == _whole(llm, text, add_special, True)


def test_special_tokens_cost_linear_time(llm, vocab):
    """`"<|im_end|>x" * N`: 4x the tokens in pieces cost about 4x (llama.cpp's one call: 16x)."""
    def seconds(n):
        started = time.perf_counter()
        _pieces(llm, vocab, "<|im_end|>x" * n, True)
        return time.perf_counter() - started

    seconds(500)
    small, large = min(seconds(2000) for _ in range(2)), min(seconds(8000) for _ in range(2))
    assert large < 8 * small + 0.2, (small, large)


def test_tokenizing_stops_at_the_context_and_when_cancelled(llm, vocab):
    with pytest.raises(prompt_tokens.ApiError) as e:
        _pieces(llm, vocab, "<|im_end|>x" * 32_000, True, n_ctx=4096)
    assert e.value.status == 400 and "at least" in e.value.message
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(prompt_tokens.Cancelled):
        _pieces(llm, vocab, "<|im_end|>x" * 32_000, True, cancelled=cancelled)
    with pytest.raises(prompt_tokens.ApiError) as e:  # more bytes than the context could hold: not tokenized
        _pieces(llm, vocab, "x" * (4096 * vocab.max_token_bytes + 1), True, n_ctx=4096)
    assert "characters" in e.value.message


def test_the_server_refuses_them_fast_and_serves_meanwhile(smollm2_path):
    server = real_server(smollm2_path, n_ctx=512)
    try:
        with health_probed(server.url) as health, httpx.Client(base_url=server.url, timeout=60) as c:
            started = time.monotonic()
            r = c.post("/api/generate", json={"model": MODEL, "prompt": "<|im_end|>x" * 32_000, "raw": True})
            assert r.status_code == 400 and "context" in r.json()["error"]
            r = c.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "a"}] * 100_000})
            assert r.status_code == 400 and "messages" in r.json()["error"]
            r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [
                {"role": "user", "content": "<|im_end|>x" * 2000}] * 20})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
            assert time.monotonic() - started < 20
    finally:
        server.stop()
    assert health and max(health) < 2.0, max(health)


class _StuckTokenizer(FakeEngine):
    """A tokenization that runs on in C for a minute (nothing in Python can stop it)."""

    def tokenize(self, text, add_special=True, parse_special=True):
        if "stuck" in text:
            time.sleep(60)
        return super().tokenize(text, add_special, parse_special)


def test_shutdown_does_not_wait_on_a_tokenization(smollm2_path):
    engine = _StuckTokenizer()
    server = start_fake(smollm2_path, engine=engine)
    answer = {}

    def ask():
        answer["r"] = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "stuck"}, timeout=30)

    asker = threading.Thread(target=ask)
    asker.start()
    time.sleep(0.5)
    assert httpx.get(server.url + "/health").status_code == 200  # served meanwhile
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 9  # the grace period (5 s), then the models are left to the exit
    asker.join(10)
    assert answer["r"].status_code == 503 and "shutting down" in answer["r"].json()["error"]["message"]


class _SlowTokenizer(FakeEngine):
    """Tokenizing takes a while (a long prompt); `started`/`finished` tell when."""

    def __init__(self):
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def tokenize(self, text, add_special=True, parse_special=True):
        if "slow" in text:
            self.started.set()
            self.release.wait(10)
        return super().tokenize(text, add_special, parse_special)


def test_a_client_leaving_during_tokenization_ends_its_request(smollm2_path):
    import socket

    engine = _SlowTokenizer()
    server = start_fake(smollm2_path, engine=engine)
    try:
        body = b'{"model": "%s", "prompt": "slow", "stream": false}' % MODEL.encode()
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert engine.started.wait(10)
        s.close()
        time.sleep(0.5)
        engine.release.set()  # the step running ends (the model stays leased until then); no next step runs
        deadline = time.monotonic() + 5
        while 'route="/v1/completions",status="499"' not in httpx.get(server.url + "/metrics").text:
            assert time.monotonic() < deadline, "the request did not end when its client left"
            time.sleep(0.05)
        assert not engine.submitted  # nothing reached the engine
    finally:
        engine.release.set()
        server.stop()


def test_pieces_give_llama_cpps_tokens_on_gemma(gemma_path):
    """Gemma: another tokenizer (SentencePiece-like, a space prefix per text) and 6,000+ special tokens."""
    model = hypura.Llama(str(gemma_path), n_ctx=256, n_threads=1, verbose=False)
    try:
        vocab = prompt_tokens.read_vocab(model)
        assert {"<start_of_turn>", "<end_of_turn>"} <= vocab.cutters
        turn = ("<start_of_turn>user\n  na\u00efve caf\u00e9 {i}  spaces\t<end_of_turn>\n"
                "<start_of_turn>model\n<end_of_turn> x")
        for text in ("".join(turn.format(i=i) for i in range(300)), "<end_of_turn>x" * 3000,
                     "<start_of_turn><end_of_turn>" * 500 + "tail"):
            for add_special in (True, False):
                assert _pieces(model, vocab, text, add_special) == _whole(model, text, add_special, True)
    finally:
        model.close()
