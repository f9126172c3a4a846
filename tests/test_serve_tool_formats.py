"""Tool-call formats and the reply splitter, without a model: each template family's calls parsed, text
left alone, thinking split out, and the same result whether a reply comes whole or a character at a time."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")

from hypura.serve.http.errors import ApiError  # noqa: E402
from hypura.serve.tools import read_choice, read_tools  # noqa: E402
from hypura.serve.tools.formats import GENERIC, HERMES, LLAMA3, MISTRAL, detect  # noqa: E402
from hypura.serve.tools.stream import ReplyStream  # noqa: E402

TOOLS = read_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize("fmt,reply,text", [
    (HERMES, f"Let me look.\n<tool_call>\n{CALL}\n</tool_call>", "Let me look."),
    (HERMES, f"<tool_call>{CALL}</tool_call>\n<tool_call>{CALL}</tool_call>", ""),
    (MISTRAL, f"[TOOL_CALLS][{CALL}, {CALL}]", ""),
    (LLAMA3, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
    (GENERIC, '```json\n{"tool_calls": [' + CALL + "]}\n```", ""),
    (GENERIC, '{"tool_call": ' + CALL + "}", ""),
])
def test_calls_parse_per_family(fmt, reply, text):
    content, calls = fmt.parse(reply, TOOLS)
    assert content == text and calls and all(c.name == "get_weather" and c.arguments == {"city": "Paris"}
                                             for c in calls)
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("fmt,reply", [
    (HERMES, "No call here."), (GENERIC, "{not json"), (GENERIC, '{"name": "rm_rf", "arguments": {}}'),
    (LLAMA3, "The weather is fine."), (MISTRAL, "[TOOL_CALLS] oops")])
def test_what_is_not_a_call_stays_text(fmt, reply):
    assert fmt.parse(reply, TOOLS) == (reply, [])


def test_detect_family():
    assert detect("{% for m in messages %}{{ m.content }}{% endfor %}") is GENERIC
    assert detect("{% if tools %}<tool_call>{% endif %}") is HERMES
    assert detect("{% if tools %}[TOOL_CALLS]{% endif %}") is MISTRAL
    assert detect("{% if tools %}<|start_header_id|>ipython{% endif %}") is LLAMA3


def _split(stream: ReplyStream, reply: str, step: int):
    thinking, content = [], []
    for i in range(0, len(reply), step):
        d = stream.push(reply[i:i + step])
        thinking.append(d.thinking)
        content.append(d.content)
    d, calls = stream.finish()
    return "".join(thinking) + d.thinking, "".join(content) + d.content, [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_reply_split_whole_or_in_pieces(step):
    reply = f"<think>\nHmm, weather.\n</think>\n\nChecking.<tool_call>\n{CALL}\n</tool_call>"
    assert _split(ReplyStream(True, False, HERMES, TOOLS), reply, step) == \
        ("Hmm, weather.\n", "Checking.", [("get_weather", {"city": "Paris"})])
    # a prompt that ends inside <think>; a reply with no call; thinking off leaves the tags as text
    assert _split(ReplyStream(True, True), "a</think>b", step) == ("a", "b", [])
    assert _split(ReplyStream(False), "<think>x</think>y", step) == ("", "<think>x</think>y", [])
    assert _split(ReplyStream(False, False, GENERIC, TOOLS), "Hello <b>there</b>", step) == \
        ("", "Hello <b>there</b>", [])
    assert _split(ReplyStream(False, False, GENERIC, TOOLS), '{"tool_calls": [' + CALL + "]}", step)[2] == \
        [("get_weather", {"city": "Paris"})]


def test_text_streams_before_a_call_is_complete():
    stream = ReplyStream(False, False, HERMES, TOOLS)
    assert stream.push("Sure, <tool").content == "Sure, "  # held: maybe the marker
    assert stream.push("_call>{").content == ""
    assert stream.push("...").content == ""


@pytest.mark.parametrize("value,word", [
    ("nope", "tools"), ([{"type": "function", "function": {"name": ""}}], "name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "parameters"),
    ([{"type": "function", "function": {"name": "f"}}] * 2, "two tools")])
def test_bad_tools(value, word):
    with pytest.raises(ApiError) as e:
        read_tools(value)
    assert e.value.status == 400 and word in e.value.message


def test_choices():
    assert read_choice(None, TOOLS) == "auto" and read_choice(None, ()) == "none"
    assert read_choice({"type": "function", "function": {"name": "get_weather"}}, TOOLS) == "get_weather"
    for bad in ("sometimes", {"function": {"name": "nope"}}, 3):
        with pytest.raises(ApiError):
            read_choice(bad, TOOLS)


def test_generic_prompt_is_one_line_a_tool():
    import json
    from pathlib import Path

    from hypura.serve.tools.formats import describe

    recorded = Path(__file__).parent / "data" / "open_webui_0.12.4_chat.json"
    tools = read_tools(json.loads(recorded.read_text())["tools"])
    text = describe(tools, "auto")
    assert all(f"- {t.name}(" in text for t in tools) and len(text.splitlines()) == len(tools) + 2
    assert len(text) < 8000  # Open WebUI's 36 tools as JSON schemas: 26 kB, over 6500 tokens
    assert "- get_weather(city: string, unit?: " not in describe(TOOLS, "required")
    assert "get_weather(city: string)" in describe(TOOLS, "required")
