"""A conversation's next turn costs only its new tokens: its history (the first turn's prompt and answer,
rendered again by the chat template) is found in the KV cache and reused, through OpenAI's
/v1/chat/completions and Ollama's /api/chat, also after other clients came and went; greedy text is the same
with reuse and without (--no-prefix-cache). A thinking template that drops earlier turns' reasoning reuses
the history up to where the last answer began. Real HTTP clients, the real engine, the default model."""

from __future__ import annotations

import concurrent.futures

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from hypura.chat_template import ChatTemplate  # noqa: E402
from serve_helpers import MODEL, engine_of, openai_client, real_server, serving, wait_idle  # noqa: E402

FIRST = [{"role": "user", "content": "Name three planets of the solar system."}]
OTHERS = ["Write a haiku about rain.", "What is 12 times 7?", "Say hello in French."]


@pytest.fixture(scope="module")
def server(smollm2_path):
    yield from serving(smollm2_path, n_ctx=1024)


@pytest.fixture(scope="module")
def oai(server):
    return openai_client(server)


def _others_come_and_go(server) -> None:
    """Other clients' conversations, at once, one through each API: they take the other slots."""
    def one(i, text):
        with httpx.Client(base_url=server.url, timeout=120) as c:
            if i % 2:
                body = {"model": MODEL, "stream": False, "options": {"num_predict": 12},
                        "messages": [{"role": "user", "content": text}]}
                assert c.post("/api/chat", json=body).status_code == 200
            else:
                body = {"model": MODEL, "max_tokens": 12, "messages": [{"role": "user", "content": text}]}
                assert c.post("/v1/chat/completions", json=body).status_code == 200

    with concurrent.futures.ThreadPoolExecutor(len(OTHERS)) as pool:
        list(pool.map(one, range(len(OTHERS)), OTHERS))


def _turns(oai, server, others: bool = True):
    first = oai.chat.completions.create(model=MODEL, messages=FIRST, max_tokens=24, temperature=0)
    if others:
        _others_come_and_go(server)
    history = FIRST + [{"role": "assistant", "content": first.choices[0].message.content},
                       {"role": "user", "content": "And one more?"}]
    second = oai.chat.completions.create(model=MODEL, messages=history, max_tokens=16, temperature=0)
    return first, second


def _kept(usage, finish_reason: str) -> int:
    """Tokens of a turn in the KV cache after it: the prompt and the reply (a last token cut by max_tokens is
    sampled but never evaluated; an end-of-generation token neither)."""
    return usage.prompt_tokens + usage.completion_tokens - (finish_reason == "length")


def test_openai_second_turn_reuses_the_first_turn_after_other_clients(oai, server):
    engine = engine_of(server)
    before = wait_idle(engine)["cached_tokens"]
    first, second = _turns(oai, server)
    kept = _kept(first.usage, first.choices[0].finish_reason)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # the history re-rendered is the first turn's tokens; a reply's text may tokenize otherwise at its last token
    assert kept - 2 <= cached <= kept, (cached, kept, first.choices[0].message.content)
    assert second.usage.prompt_tokens - cached < 20  # the end of the answer and the new message
    assert wait_idle(engine)["cached_tokens"] - before >= cached  # the engine's counter (/metrics) saw it


def test_ollama_second_turn_reuses_the_first_turn(server):
    options = {"temperature": 0, "num_predict": 24}
    with httpx.Client(base_url=server.url, timeout=120) as c:
        body = {"model": MODEL, "messages": FIRST, "stream": False, "options": options}
        first = c.post("/api/chat", json=body).json()
        _others_come_and_go(server)
        history = FIRST + [first["message"], {"role": "user", "content": "And one more?"}]
        lines = c.post("/api/chat", json={"model": MODEL, "messages": history, "options": options}).text.splitlines()
    final = httpx.Response(200, content=lines[-1]).json()
    kept = first["prompt_eval_count"] + first["eval_count"] - (first["done_reason"] == "length")
    assert first["hypura"]["cached_tokens"] == 0 or first["hypura"]["cached_tokens"] < first["prompt_eval_count"]
    assert kept - 2 <= final["hypura"]["cached_tokens"] <= kept, (final, first)


def test_greedy_turns_are_the_same_with_and_without_reuse(oai, server, smollm2_path):
    _, reused = _turns(oai, server, others=False)
    assert reused.usage.prompt_tokens_details.cached_tokens > 30
    fresh = real_server(smollm2_path, n_ctx=1024, prefix_cache=False)
    try:
        _, whole = _turns(openai_client(fresh), fresh, others=False)
    finally:
        fresh.stop()
    assert whole.usage.prompt_tokens_details.cached_tokens == 0
    assert whole.usage.prompt_tokens == reused.usage.prompt_tokens
    assert whole.choices[0].message.content == reused.choices[0].message.content


# Qwen3's way: an earlier answer is written without its reasoning, a new one opens with <think>
THINKING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
            "enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")


def test_a_template_that_drops_reasoning_reuses_the_history_before_the_answer(oai, server):
    """The first turn's KV holds `<think>\\n` + reasoning + `</think>` + answer; the history renders the answer
    alone, so the shared prefix ends where the reply began: the answer is evaluated again, the rest is reused."""
    entry = next(iter(server.state.registry))
    plain, entry.template = entry.template, ChatTemplate(THINKING)
    try:
        grammar = 'root ::= "one two</think>" [A-Z] [a-z]{2,8}'
        first = oai.chat.completions.create(model=MODEL, messages=FIRST, max_tokens=24, temperature=0,
                                            extra_body={"grammar": grammar,
                                                        "chat_template_kwargs": {"enable_thinking": True}})
        assert first.choices[0].message.reasoning_content.strip() == "one two"
        history = FIRST + [{"role": "assistant", "content": first.choices[0].message.content},
                           {"role": "user", "content": "And one more?"}]
        second = oai.chat.completions.create(model=MODEL, messages=history, max_tokens=4, temperature=0)
    finally:
        entry.template = plain
    cached, prompt = second.usage.prompt_tokens_details.cached_tokens, first.usage.prompt_tokens
    assert prompt - 4 <= cached < prompt  # all of the first prompt but its `<think>\n`
