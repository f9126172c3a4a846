"""What both APIs do for a chat beyond the plain conversation: tools, thinking and a grammar.

`prepare` renders the conversation with the tools (natively, as llama-cpp-python's Jinja formatter passes
`tools`, or described in a system message for a template without tool support) and the thinking switch
(`enable_thinking`, for templates that have it), and picks the grammar: the forced call's for tool_choice
"required" or a named function, else the response format's. Its `reply()` splits the generated text into
thinking, text and calls (stream.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from hypura.serve.generate.generation import chat_prompt
from hypura.serve.http.errors import bad_request
from hypura.serve.models.entry import ModelEntry
from hypura.serve.tools import Tool, as_object, selected
from hypura.serve.tools.formats import GENERIC, ToolFormat, describe, detect
from hypura.serve.tools.stream import THINK_CLOSE, THINK_OPEN, ReplyStream


def thinks(entry: ModelEntry) -> bool:
    """The template writes a thinking block (Qwen3, DeepSeek-R1 and their kind)."""
    return entry.template is not None and thinks_in(entry.template.source)


def thinks_in(template_source: str) -> bool:
    return THINK_OPEN in template_source and THINK_CLOSE in template_source


def tools_served(entry: ModelEntry) -> bool:
    return entry.template is not None  # native or generic: every chat template can be given tools


@dataclass(frozen=True)
class ChatSpec:
    """A chat request's tools, thinking and structured output, as its API's fields said."""

    tools: tuple[Tool, ...] = ()
    choice: str = "none"  # none, auto, required, or the one function's name
    parallel: bool = True  # several calls in one reply
    think: Optional[bool] = None  # None: the template's default
    grammar: Optional[str] = None  # the response format's


@dataclass(frozen=True)
class Prepared:
    tokens: list[int]
    grammar: Optional[str]
    think: bool  # split <think> blocks out of the reply
    starts_thinking: bool  # the prompt ends inside <think>
    format: Optional[ToolFormat]
    tools: tuple[Tool, ...]

    def reply(self) -> ReplyStream:
        return ReplyStream(self.think, self.starts_thinking, self.format, self.tools)


async def prepare(entry: ModelEntry, messages: list[dict], spec: ChatSpec) -> Prepared:
    template = entry.chat_template()
    can_think = thinks(entry)
    if spec.think and not can_think:
        raise bad_request(f"{entry.name} does not support thinking")
    tools = spec.tools if spec.choice != "none" else ()
    family = detect(template.source)
    fmt = family if tools else None
    grammar = spec.grammar
    if tools and spec.choice != "auto":
        grammar = fmt.grammar(selected(tools, spec.choice), spec.parallel)
    variables = {}
    think = spec.think
    if can_think and think is None and grammar is not None:
        think = False  # a grammar constrains the whole reply: no room for a thinking block
    if can_think and think is not None:
        variables["enable_thinking"] = think
    # earlier calls and results are written as text for a template without tools, offered or not now
    messages = [_for_template(m, family is GENERIC) for m in messages]
    if family is GENERIC:
        messages = _merge_tool_results(_with_system(messages, describe(tools, spec.choice)) if tools else messages)
    elif tools:
        variables["tools"] = [t.spec for t in tools]
    text, tokens = await chat_prompt(entry, messages, **variables)
    thinking = can_think and think is not False
    starts = thinking and text.rstrip().endswith(THINK_OPEN)
    return Prepared(tokens, grammar, thinking, starts, fmt, tools)


def _for_template(message: dict, generic: bool) -> dict:
    """A message as templates read it: calls' arguments as objects (or, for a template without tools,
    calls and results written out as text)."""
    m = dict(message)
    calls = m.pop("tool_calls", None)
    if m.get("thinking") is not None:
        m["reasoning_content"] = m.pop("thinking")  # Ollama's field, as Qwen3's template reads it
    if m.get("tool_name") is not None:
        m["name"] = m.pop("tool_name")
    if calls:
        if not isinstance(calls, list):
            raise bad_request("'tool_calls' of a message must be a list")
        normal = [_call(c, i) for i, c in enumerate(calls)]
        if generic:
            written = json.dumps({"tool_calls": [c["function"] for c in normal]}, ensure_ascii=False)
            m["content"] = f"{m['content']}\n{written}" if m.get("content") else written
        else:
            m["tool_calls"] = normal
    if generic and m.get("role") == "tool":
        name = f" of {m['name']}" if m.get("name") else ""
        m = {"role": "user", "content": f"Result{name}: {m.get('content') or ''}", "tool_result": True}
    return m


def _call(call, i: int) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request("each of a message's 'tool_calls' must be {\"function\": {\"name\", \"arguments\"}}")
    arguments = as_object(fn.get("arguments"))
    if arguments is None:
        raise bad_request(f"tool call '{fn['name'][:100]}': 'arguments' must be a JSON object")
    return {"id": call.get("id") or f"call_{i}", "type": "function",
            "function": {"name": fn["name"], "arguments": arguments}}


def _with_system(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [{**first, "content": f"{first.get('content') or ''}\n\n{text}".strip()}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _merge_tool_results(messages: list[dict]) -> list[dict]:
    """Consecutive results become one user message: templates that want roles to alternate accept it."""
    out: list[dict] = []
    for m in messages:
        if m.pop("tool_result", False) and out and out[-1].get("role") == "user":
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{m['content']}"}
        else:
            out.append(m)
    return out
