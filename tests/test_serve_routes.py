"""The server's routes over HTTP (uvicorn on 127.0.0.1, a free port) against a stand-in engine: listings and
generation in both APIs' shapes. Refusals, disconnects and auth: test_serve_refusals.py; the same with
the real engine: test_serve_clients.py and test_serve_load.py."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from hypura.chat_template import ChatTemplate  # noqa: E402
from serve_fakes import MODEL, FakeLlama, ndjson_lines, sse_events, start_fake  # noqa: E402


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


# --- listing routes ---------------------------------------------------------------------------------
def test_root_version_health(client):
    assert client.get("/").status_code == 200
    assert client.get("/api/version").json()["version"]
    assert client.get("/health").json() == {"status": "ok"}


def test_tags_ps_show_models(client, server):
    tags = client.get("/api/tags").json()["models"]
    assert [m["name"] for m in tags] == [MODEL]
    assert tags[0]["details"]["quantization_level"] == "Q4_1" and tags[0]["details"]["family"] == "llama"
    assert len(tags[0]["digest"]) == 64 and tags[0]["size"] > 90_000_000
    ps = client.get("/api/ps").json()["models"]
    assert ps[0]["name"] == MODEL and ps[0]["context_length"] == 512 and ps[0]["size_vram"] == 0
    show = client.post("/api/show", json={"model": MODEL}).json()
    assert "<|im_start|>" in show["template"] and show["capabilities"] == ["completion", "tools"]
    assert show["model_info"]["llama.block_count"] == 30 and "tokenizer.chat_template" not in show["model_info"]
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL


def test_short_names_resolve(client):
    for name in ("smollm2-135m-instruct", "smollm2-135m-instruct:latest", "SmolLM2-135M-Instruct:Q4_1"):
        assert client.post("/api/show", json={"model": name}).status_code == 200


# --- Ollama generation ------------------------------------------------------------------------------
def test_generate_streams_ndjson_with_final_metrics(client, server):
    r = client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "options": {"num_predict": 3}})
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = ndjson_lines(r)
    assert [x["response"] for x in lines[:-1]] == ["w0 ", "w1 ", "w2 "] and not any(x["done"] for x in lines[:-1])
    last = lines[-1]
    assert last["done"] and last["done_reason"] == "length" and last["eval_count"] == 3
    for key in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_duration"):
        assert isinstance(last[key], int)
    assert last["context"][-3:] == [100, 101, 102]  # prompt tokens, then the generated ones


def test_generate_applies_the_chat_template_unless_raw(client, server, smollm2_path):
    short = {"num_predict": 2}
    client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "system": "Be brief.", "stream": False,
                                       "options": short})
    llm = FakeLlama(smollm2_path)
    text = ChatTemplate(llm.metadata["tokenizer.chat_template"], "<|im_start|>", "<|im_end|>").render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert server.engine.submitted[-1].tokens == server.engine.tokenize(text, add_special=False)
    client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "raw": True, "stream": False,
                                       "options": short})
    assert server.engine.submitted[-1].tokens == server.engine.tokenize("Hi")


def test_generate_whole_response(client):
    r = client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False,
                                           "options": {"num_predict": 2}}).json()
    assert r["response"] == "w0 w1 " and r["done"] and r["done_reason"] == "length"


def test_options_reach_the_sampler(client, server):
    options = {"temperature": 0.1, "top_k": 7, "top_p": 0.5, "min_p": 0.2, "seed": 42, "num_predict": 5,
               "stop": ["w3"], "repeat_penalty": 1.3, "num_ctx": 100_000, "num_gpu": 99, "num_thread": 3}
    r = client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False, "options": options})
    assert r.status_code == 200, r.text
    p = server.engine.submitted[-1].params
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.stop, p.repeat_penalty) == \
        (0.1, 7, 0.5, 0.2, 42, ("w3",), 1.3)
    assert p.max_tokens == 5 and r.json()["response"] == "w0 w1 w2 " and r.json()["done_reason"] == "stop"


def test_num_ctx_bounds_the_request(client, server):
    client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "raw": True, "stream": False,
                                       "options": {"num_ctx": 8}})
    assert server.engine.submitted[-1].params.max_tokens == 8 - 3  # BOS + 2 bytes leave 5 of 8
    r = client.post("/api/generate", json={"model": MODEL, "prompt": "Hello there", "options": {"num_ctx": 8}})
    assert r.status_code == 400 and "context" in r.json()["error"]


def test_chat_stream_and_whole(client):
    messages = [{"role": "user", "content": "Hi"}]
    lines = ndjson_lines(client.post("/api/chat", json={"model": MODEL, "messages": messages,
                                                        "options": {"num_predict": 2}}))
    assert [x["message"]["content"] for x in lines] == ["w0 ", "w1 ", ""]
    assert lines[-1]["done"] and lines[-1]["message"]["role"] == "assistant" and lines[-1]["eval_count"] == 2
    whole = client.post("/api/chat", json={"model": MODEL, "messages": messages, "stream": False,
                                           "options": {"num_predict": 2}}).json()
    assert whole["message"] == {"role": "assistant", "content": "w0 w1 "} and whole["done_reason"] == "length"


def test_empty_prompt_or_messages_load(client):
    assert client.post("/api/generate", json={"model": MODEL}).json()["done_reason"] == "load"
    assert client.post("/api/chat", json={"model": MODEL, "messages": []}).json()["done_reason"] == "load"


def test_mid_stream_error_is_the_last_line(client, server):
    server.engine.fail_after = 2
    lines = ndjson_lines(client.post("/api/generate", json={"model": MODEL, "prompt": "Hi"}))
    assert [x.get("response") for x in lines[:2]] == ["w0 ", "w1 "]
    assert lines[-1] == {"error": "generation failed: weights could not be read"}
    r = client.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": False})
    assert r.status_code == 500 and "weights could not be read" in r.json()["error"]


# --- OpenAI generation ------------------------------------------------------------------------------
def test_chat_completions(client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    r = client.post("/v1/chat/completions", json=body).json()
    assert r["object"] == "chat.completion" and r["choices"][0]["message"]["content"] == "w0 w1 w2 "
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 3 and r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 3


def test_chat_completions_stream_with_usage(client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    r = client.post("/v1/chat/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "w0 w1 "
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2


def test_completions_text_tokens_echo_stream(client, server):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, "echo": True}).json()
    assert r["object"] == "text_completion" and r["choices"][0]["text"] == "Hiw0 w1 "
    client.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1})
    assert server.engine.submitted[-1].tokens == [1, 2, 3]
    events = sse_events(client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2,
                                                             "stream": True}))
    assert events[-1] == "[DONE]" and "".join(e["choices"][0]["text"] for e in events[:-1]) == "w0 w1 "
    assert "usage" not in events[0]


def test_openai_extra_sampling_fields(client, server):
    client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1, "temperature": 0,
                                         "top_k": 3, "min_p": 0.1, "repeat_penalty": 1.2, "seed": 7,
                                         "stop": "w9", "presence_penalty": 0.5})
    p = server.engine.submitted[-1].params
    assert (p.temperature, p.top_k, p.min_p, p.repeat_penalty, p.seed, p.stop, p.presence_penalty) == \
        (0.0, 3, 0.1, 1.2, 7, ("w9",), 0.5)


def test_metrics_prometheus_text(client):
    client.get("/api/tags")
    text = client.get("/metrics").text
    assert f'hypura_engine_requests_total{{model="{MODEL}"}}' in text
    assert f'hypura_engine_llama_bytes_per_token_ram{{model="{MODEL}"}} 1024' in text
    assert 'hypura_http_requests_total{route="/api/tags",status="200"}' in text
    assert "hypura_ready 1" in text
