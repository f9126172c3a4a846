"""The real server (real engine, default model) driven by the tools people use: the official `ollama` and
`openai` clients, LangChain's ChatOllama / ChatOpenAI, and HypuraLlamaCpp with Hypura's placement.
Greedy output served equals llama-cpp-python's own for the same prompt and chat template."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

import llama_cpp  # noqa: E402

from serve_helpers import MODEL, ONE_THREAD, engine_of, openai_client, real_server, serving, wait_idle  # noqa: E402

GREEDY = {"temperature": 0, "num_predict": 12}
MESSAGES = [{"role": "user", "content": "Name one planet."}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    yield from serving(smollm2_path, prefix_cache=False)  # a reply depends on its prompt alone: replies compare


@pytest.fixture(scope="module")
def oai(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def reference(smollm2_path):
    """llama-cpp-python's Llama on the same file: the oracle for greedy text and chat templates. With flash
    attention, as the engine runs llama.cpp's default ("auto": on here); without, a near tie decides
    another token after a few."""
    llm = llama_cpp.Llama(str(smollm2_path), n_ctx=512, verbose=False, flash_attn=True, **ONE_THREAD)
    yield llm
    llm.close()


def test_ollama_client_listing(server):
    client = ollama.Client(host=server.url)
    assert [m.model for m in client.list().models] == [MODEL]
    shown = client.show(MODEL)
    assert shown.details.quantization_level == "Q4_1" and shown.details.family == "llama"
    assert "<|im_start|>" in shown.template and shown.modelinfo["general.architecture"] == "llama"
    running = client.ps().models
    assert running[0].model == MODEL and running[0].context_length == 512


@pytest.mark.slow
def test_ollama_client_generate_and_chat(server):
    client = ollama.Client(host=server.url)
    whole = client.generate(model=MODEL, prompt="Name one planet.", options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.response
    assert whole.eval_count >= 1 and whole.prompt_eval_count > 5 and whole.eval_duration > 0
    streamed = list(client.generate(model=MODEL, prompt="Name one planet.", options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == whole.response and streamed[-1].done
    chat = client.chat(model=MODEL, messages=MESSAGES, options=GREEDY)
    assert chat.message.role == "assistant" and chat.message.content == whole.response  # same template, same prompt
    parts = list(client.chat(model=MODEL, messages=MESSAGES, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == chat.message.content
    assert parts[-1].done and parts[-1].eval_count == chat.eval_count
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="llama3:8b", prompt="x")
    assert e.value.status_code == 404


def test_openai_client(server, oai):
    assert [m.id for m in oai.models.list().data] == [MODEL]
    r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12)
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(oai.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12, stream=True,
                                              stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    c = oai.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=6)
    pieces = oai.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=6,
                                    stream=True)
    assert "".join(p.choices[0].text for p in pieces) == c.choices[0].text and "Paris" in c.choices[0].text
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="context"):
        oai.completions.create(model=MODEL, prompt="word " * 600)
    wait_idle(engine_of(server))


def test_llama_cpp_server_style_fields(oai):
    """Clients written for llama-cpp-python's server send llama.cpp's extra sampling fields: honoured."""
    r = oai.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0.7,
                               extra_body={"top_k": 1, "min_p": 0.0, "repeat_penalty": 1.0})
    greedy = oai.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.choices[0].text == greedy.choices[0].text  # top_k 1 is greedy at any temperature


@pytest.mark.slow
def test_greedy_output_equals_llama_cpp_python(oai, reference):
    chat = oai.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12)
    ref = reference.create_chat_completion(messages=MESSAGES, temperature=0, max_tokens=12, repeat_penalty=1.0)
    assert chat.choices[0].message.content == ref["choices"][0]["message"]["content"]
    text = oai.completions.create(model=MODEL, prompt="Three facts about llamas:", temperature=0, max_tokens=12)
    ref = reference.create_completion("Three facts about llamas:", temperature=0, max_tokens=12, repeat_penalty=1.0)
    assert text.choices[0].text == ref["choices"][0]["text"]


@pytest.mark.slow
def test_langchain_chat_ollama_and_chat_openai(server):
    langchain_ollama = pytest.importorskip("langchain_ollama")
    langchain_openai = pytest.importorskip("langchain_openai")
    # repeat_penalty 1.0: OpenAI's routes have no penalty by default (Ollama's default is 1.1)
    chat = langchain_ollama.ChatOllama(model=MODEL, base_url=server.url, temperature=0, num_predict=12,
                                       repeat_penalty=1.0)
    answer = chat.invoke("Name one planet.")
    assert answer.content and "".join(c.content for c in chat.stream("Name one planet.")) == answer.content
    chat = langchain_openai.ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key="unused", temperature=0,
                                       max_tokens=12, max_retries=0)
    answer2 = chat.invoke("Name one planet.")
    assert answer2.content == answer.content  # both APIs, one template, greedy
    assert "".join(c.content for c in chat.stream("Name one planet.")) == answer2.content


@pytest.mark.slow
def test_langchain_llamacpp_with_hypura_placement(smollm2_path):
    pytest.importorskip("langchain_community")
    from langchain_community.llms import LlamaCpp

    import hypura
    from hypura.integrations.langchain import HypuraLlamaCpp

    common = dict(model_path=str(smollm2_path), n_ctx=256, temperature=0, max_tokens=8, verbose=False,
                  n_threads=1)
    vanilla = LlamaCpp(**common, model_kwargs={"ram": "250MiB"})
    assert type(vanilla.client) is llama_cpp.Llama  # LangChain's own: Hypura's keywords vanish
    expected = vanilla.invoke("The capital of France is")
    vanilla.client.close()
    streamed = HypuraLlamaCpp(**common, model_kwargs={"ram": "250MiB"})  # a budget that streams from disk
    assert isinstance(streamed.client, hypura.Llama) and streamed.client.plan.tensors_by_tier()["disk"] > 0
    assert streamed.invoke("The capital of France is") == expected
    assert streamed.client.stats()["stream"]["bytes"]["disk"] > 0
    streamed.client.close()
    given = hypura.Llama(str(smollm2_path), n_ctx=256, n_threads=1, verbose=False)
    kept = HypuraLlamaCpp(client=given, temperature=0, max_tokens=8)
    assert kept.client is given and kept.invoke("The capital of France is") == expected
    given.close()


def test_served_under_a_streamed_plan(smollm2_path, oai):
    """--ram passes through to hypura.Llama's planner: a budget that streams weights from disk serves the
    same greedy replies as the resident model."""
    streamed = real_server(smollm2_path, parallel=2, n_ctx=256, prefix_cache=False, ram="320MiB")
    try:
        llm = next(iter(streamed.state.registry)).llm
        assert llm.plan.tensors_by_tier()["disk"] > 0
        client = openai_client(streamed)
        got = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=8)
        want = oai.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=8)
        assert got.choices[0].message.content == want.choices[0].message.content
        assert llm.stats()["stream"]["bytes"]["disk"] > 0
    finally:
        streamed.stop()
