"""Tool calls served to the official clients (openai, ollama) and LangChain, by the real engine and the default
model, whose template has no tool support (the generic format: tools described in a system message). Forced
calls (required, a named function) go through a grammar, so even this small model returns valid calls; and the
request Open WebUI sends from its UI (its built-in tools with every chat) is answered with a normal reply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from serve_helpers import MODEL, openai_client, serving  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                         "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# the longest forced call of WEATHER or TIME: a city of 24 6-byte \uXXXX escapes, a space wherever the grammar
# allows one: 250 bytes, so at most 250 tokens. Fewer let a sampled run of emoji end at the limit.
LONGEST_CALL = 250


@pytest.fixture(scope="module")
def server(smollm2_path):
    yield from serving(smollm2_path, n_ctx=2048)


@pytest.fixture(scope="module")
def oai(server):
    return openai_client(server)


def _valid_weather(arguments: dict) -> None:
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
    assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 24


@pytest.mark.slow
def test_openai_required_and_named_calls(oai):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        for _ in range(3):
            r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                            temperature=1.0, max_tokens=LONGEST_CALL, parallel_tool_calls=False)
            choice0 = r.choices[0]
            assert choice0.finish_reason == "tool_calls" and len(choice0.message.tool_calls) == 1
            call = choice0.message.tool_calls[0]
            assert call.type == "function" and call.id.startswith("call_")
            if choice != "required":
                assert call.function.name == "get_weather"
            if call.function.name == "get_weather":
                _valid_weather(json.loads(call.function.arguments))


@pytest.mark.slow
def test_openai_streamed_call_and_a_tool_message_sent_back(oai):
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=LONGEST_CALL, temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert calls[0].id and calls[0].function.name == "get_weather" and calls[0].index == 0
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    _valid_weather(json.loads(arguments))
    assert len(calls) >= 2 and all(tc.id is None for tc in calls[1:])  # arguments come in pieces
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [{
        "id": calls[0].id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temperature": 21, "sky": "clear"}'}]
    r = oai.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                    max_tokens=24, temperature=0)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    r = oai.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=24, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_openai_auto_answers(oai):
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                    tools=[WEATHER], max_tokens=16, temperature=0)
    message = r.choices[0].message
    assert message.content or message.tool_calls


def test_ollama_tools_and_tool_message(server):
    client = ollama.Client(host=server.url)
    r = client.chat(model=MODEL, messages=ASK, tools=[WEATHER], options={"num_predict": 32, "temperature": 0})
    assert r.message.role == "assistant" and (r.message.content or r.message.tool_calls)
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "21 degrees, clear"}]
    r = client.chat(model=MODEL, messages=history, tools=[WEATHER], options={"num_predict": 24, "temperature": 0})
    assert r.message.content or r.message.tool_calls
    streamed = list(client.chat(model=MODEL, messages=history, tools=[WEATHER], stream=True,
                                options={"num_predict": 24, "temperature": 0}))
    # greedy both, but not the same text: the second reuses the first's prompt cells (the prefix cache), computed
    # in another batch shape, and llama.cpp's kernels are not batch-invariant (seen: '{"tool_c…' against 'The weat…')
    text = "".join(p.message.content or "" for p in streamed)
    assert streamed[-1].done and (text or any(p.message.tool_calls for p in streamed))
    assert "tools" in client.show(MODEL).capabilities


def test_langchain_bind_tools(server):
    from langchain_ollama import ChatOllama
    from langchain_openai import ChatOpenAI

    def get_weather(city: str, unit: str) -> str:
        """The current weather in a city, in celsius or fahrenheit."""
        return "21"

    chat = ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key="unused", max_tokens=80, temperature=0)
    # one call: with parallel calls allowed, greedy SmolLM2 may start a second one and run out of max_tokens
    message = chat.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False) \
        .invoke("Weather in Paris, in celsius?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    assert set(message.tool_calls[0]["args"]) == {"city", "unit"}
    message = ChatOllama(model=MODEL, base_url=server.url, num_predict=24, temperature=0) \
        .bind_tools([get_weather]).invoke("Weather in Paris?")
    assert message.content or message.tool_calls


# what Open WebUI 0.12.4 sent from its UI with default settings ("native" function calling): its 36 built-in
# tools with every chat (recorded through a proxy in front of `hypura serve`)
OPEN_WEBUI_CHAT = json.loads((Path(__file__).parent / "data" / "open_webui_0.12.4_chat.json").read_text())


@pytest.mark.slow
def test_open_webui_chat_with_its_builtin_tools(server):
    body = {**OPEN_WEBUI_CHAT, "options": {"num_predict": 48}}  # a bounded reply, for the test's time
    assert body["model"] == MODEL and len(body["tools"]) == 36
    with httpx.Client(base_url=server.url, timeout=120) as client:
        with client.stream("POST", "/api/chat", json=body) as r:
            assert r.status_code == 200
            parts = [json.loads(line) for line in r.iter_lines() if line]
        assert parts[-1]["done"] and all("error" not in p for p in parts)
        reply = "".join(p["message"].get("content", "") for p in parts)
        called = [c for p in parts for c in p["message"].get("tool_calls") or []]
        assert reply.strip() or called
        # the same conversation through OpenAI's API, as Open WebUI sends it to an OpenAI connection
        r = client.post("/v1/chat/completions", json={
            "model": MODEL, "stream": False, "max_tokens": 48, "messages": body["messages"], "tools": body["tools"]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_bad_tools_are_400_and_the_server_goes_on(server, oai):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for body in ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}],
                      "tool_choice": "required"},
                     {"tools": [{"type": "function", "function": {"name": "f"}}],
                      "tool_choice": {"type": "function", "function": {"name": "g"}}},
                     {"tools": "all of them"}):
            r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body})
            assert r.status_code == 400 and "\n" not in r.json()["error"]["message"]
    assert oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4).choices[0].message.content
