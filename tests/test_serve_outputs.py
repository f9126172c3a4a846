"""Structured outputs, embeddings, logprobs, n > 1 and thinking, served by the real engine and the default model
to the official clients and LangChain: every sampled reply at temperature 1 parses and validates against its
schema (a grammar per sequence); embeddings have the model's size, unit length, and a batch equals its inputs one
by one; logprobs are the model's; n replies share the prompt's KV; a thinking template's reasoning comes apart."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

pytest.importorskip("starlette")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from hypura.chat_template import ChatTemplate  # noqa: E402
from serve_helpers import MODEL, engine_of, openai_client, serving, wait_idle  # noqa: E402

N_EMBD = 576  # SmolLM2-135M's llama.embedding_length
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "role"], "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 16}, "age": {"type": "integer", "minimum": 0,
                                                                         "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    "role": {"enum": ["admin", "user", "guest"]}, "email": {"type": "string", "maxLength": 20}}}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]
# PERSON's longest reply: every character a 6-byte \uXXXX escape, a space wherever the grammar allows one: 452
# bytes, so at most 452 tokens (each one is a byte or more). Fewer let a sampled run of emoji end at the limit.
LONGEST_PERSON = 452


@pytest.fixture(scope="module")
def server(smollm2_path):
    yield from serving(smollm2_path, n_ctx=1024)


@pytest.fixture(scope="module")
def oai(server):
    return openai_client(server)


@pytest.mark.slow
def test_json_schema_samples_validate(oai, server):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    replies = []
    for _ in range(2):
        r = oai.chat.completions.create(model=MODEL, messages=ASK, response_format=response_format, temperature=1.0,
                                        max_tokens=LONGEST_PERSON, n=6)
        replies += [(c.message.content, c.finish_reason) for c in r.choices]
    client = ollama.Client(host=server.url)
    for _ in range(4):
        r = client.chat(model=MODEL, messages=ASK, format=PERSON,
                        options={"temperature": 1.0, "num_predict": LONGEST_PERSON})
        replies.append((r.message.content, r.done_reason))
    assert len(replies) == 16
    for content, reason in replies:
        assert reason == "stop", content
        jsonschema.validate(json.loads(content), PERSON)


def test_json_mode_both_apis(oai, server):
    # any object: its strings are unbounded, so only a reply that was not cut at max_tokens must parse
    copy = [{"role": "user", "content": 'Repeat this JSON exactly: {"city": "Paris", "country": "France"}'}]
    r = oai.chat.completions.create(model=MODEL, messages=copy, response_format={"type": "json_object"},
                                    temperature=0, max_tokens=200)
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)
    # Ollama's default repeat penalty steers a small model off repeating `"` and `}`: off, as OpenAI's above
    r = ollama.Client(host=server.url).generate(model=MODEL, prompt=copy[0]["content"], format="json",
                                                options={"num_predict": 200, "temperature": 0, "repeat_penalty": 1})
    assert r.done_reason == "stop" and isinstance(json.loads(r.response), dict), r.response


def test_langchain_with_structured_output(server):
    from langchain_ollama import ChatOllama
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class City(BaseModel):
        """A city and its country."""
        name: str = Field(max_length=20)
        country: str = Field(max_length=20)

    for chat in (ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key="unused", max_tokens=80),
                 ChatOllama(model=MODEL, base_url=server.url, num_predict=80)):
        city = chat.with_structured_output(City).invoke("Name a city in France.")
        assert isinstance(city, City) and city.name


def test_bad_schema_and_grammar_are_400(server, oai):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for body in ({"grammar": "root ::= ("}, {"grammar": "root ::= root \"a\""}, {"grammar": "start ::= \"a\""},
                     {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "wat"}}}}):
            r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body})
            assert r.status_code == 400 and "\n" not in r.json()["error"]["message"], r.text
        r = client.post("/api/chat", json={"model": MODEL, "messages": ASK, "format": {"properties": 3}})
        assert r.status_code == 400 and "format" in r.json()["error"]
    r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8,
                                    extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].message.content in ("yes", "no")


@pytest.mark.slow
def test_embeddings_both_apis(server, oai):
    texts = ["The cat sat on the mat.", "Quantum chromodynamics", "hello"]
    client = ollama.Client(host=server.url)
    batch = np.array(client.embed(model=MODEL, input=texts).embeddings)
    one_by_one = np.array([client.embed(model=MODEL, input=t).embeddings[0] for t in texts])
    assert batch.shape == (3, N_EMBD) and np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-4)
    assert np.allclose(batch, one_by_one, atol=1e-5)
    assert batch[0] @ batch[1] < 0.9999
    legacy = np.array(client.embeddings(model=MODEL, prompt=texts[0]).embedding)
    assert np.allclose(legacy / np.linalg.norm(legacy), batch[0], atol=1e-4)  # the same vector, not normalised
    r = oai.embeddings.create(model=MODEL, input=texts)  # the client asks for base64 and decodes it
    assert np.allclose(np.array([d.embedding for d in r.data]), batch, atol=1e-5) and r.usage.prompt_tokens > 3
    r = oai.embeddings.create(model=MODEL, input=texts[:1], encoding_format="float")
    assert np.allclose(r.data[0].embedding, batch[0], atol=1e-5)
    ids = engine_of(server).tokenize(texts[2], True, False)
    raw = httpx.post(server.url + "/v1/embeddings", json={"model": MODEL, "input": ids, "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype=np.float32)
    assert np.allclose(vector, batch[2], atol=1e-5)
    long = httpx.post(server.url + "/api/embed", json={"model": MODEL, "input": "x " * 2000, "truncate": False})
    assert long.status_code == 400 and "truncate" in long.json()["error"]
    assert len(client.embed(model=MODEL, input="x " * 2000).embeddings[0]) == N_EMBD  # truncated by default


def test_logprobs(oai, server):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=6, temperature=0, logprobs=True,
                                    top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert item.logprob == pytest.approx(tops[0], abs=1e-4)  # greedy: the most likely token
        assert item.token == item.top_logprobs[0].token and bytes(item.bytes).decode(errors="replace") == item.token
    r = oai.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4 and "".join(lp.tokens) == \
        r.choices[0].text and all(len(t) == 2 for t in lp.top_logprobs)
    streamed = [c.choices[0].logprobs for c in oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=4, temperature=0, logprobs=True, stream=True) if c.choices]
    assert sum(len(x.content) for x in streamed if x) == 4
    r = ollama.Client(host=server.url).chat(model=MODEL, messages=ASK, logprobs=True, top_logprobs=2,
                                            options={"num_predict": 4, "temperature": 0})
    assert len(r.logprobs) == 4 and all(len(x.top_logprobs) == 2 for x in r.logprobs)


def test_n_choices_share_the_prompt(oai, server):
    engine = engine_of(server)
    before = wait_idle(engine)["cached_tokens"]
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me a story, please."}],
                                    n=3, max_tokens=8, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2] and all(c.message.content for c in r.choices)
    assert r.usage.completion_tokens == sum(8 if c.finish_reason == "length" else 0 for c in r.choices) or \
        r.usage.completion_tokens <= 24
    assert wait_idle(engine)["cached_tokens"] - before >= 2 * (r.usage.prompt_tokens - 1)


THINKING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
            "enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")


@pytest.fixture
def thinking_model(server):
    entry = next(iter(server.state.registry))
    plain, entry.template = entry.template, ChatTemplate(THINKING)
    yield entry
    entry.template = plain


def test_thinking_both_apis(server, oai, thinking_model):
    grammar = 'root ::= [a-z]{2,10} " " [a-z]{2,10} "</think>" [A-Z] [a-z]{2,10}'
    r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, extra_body={
        "grammar": grammar, "chat_template_kwargs": {"enable_thinking": True}})
    message = r.choices[0].message
    assert message.reasoning_content and " " in message.reasoning_content and message.content[0].isupper()
    chunks = list(oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, stream=True, extra_body={
        "grammar": grammar, "chat_template_kwargs": {"enable_thinking": True}}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert " " in reasoning and "</think>" not in reasoning + content and content[0].isupper()
    client = ollama.Client(host=server.url)
    on = client.chat(model=MODEL, messages=ASK, think=True, options={"num_predict": 12, "temperature": 0})
    assert on.message.thinking and not on.message.content  # the prompt ends inside <think>; it never closes here
    off = client.chat(model=MODEL, messages=ASK, think=False, options={"num_predict": 12, "temperature": 0})
    assert off.message.content and not off.message.thinking
    assert "thinking" in client.show(MODEL).capabilities


def test_images_and_suffix_refused_clearly(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "x",
                                                                          "images": ["aGk="]}]})
        assert r.status_code == 400 and "images" in r.json()["error"]
        r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]}]})
        assert r.status_code == 400 and "text" in r.json()["error"]["message"]
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "def f(", "suffix": "return 1"})
        assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]
