"""Tool calling: a chat's tools, thinking and grammar, and the replies split into text and calls.

    __init__.py  Tool, ToolCall: the tools a request offers, read and checked
    formats.py   the call formats chat templates imply (hermes, mistral, llama3, generic)
    stream.py    a reply split as it streams into thinking, text and tool calls
    chat.py      a chat's tools, thinking and grammar together
    replies.py   whole replies, and `n` replies sharing the prompt's KV

Both APIs send tools in OpenAI's shape, `[{"type": "function", "function": {"name", "description",
"parameters"}}]`; a reply's calls come back as ToolCall, which each route writes in its own shape.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Optional

from hypura.serve.http.errors import bad_request

CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict  # a JSON schema of the arguments object
    spec: dict  # the tool as the chat template sees it: {"type": "function", "function": {...}}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    id: str

    @staticmethod
    def make(name: str, arguments: dict) -> "ToolCall":
        return ToolCall(name, arguments, f"call_{uuid.uuid4().hex[:24]}")

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


def read_tools(value) -> tuple[Tool, ...]:
    """`tools` of a request; each problem is a 400 naming the tool."""
    if value in (None, []):
        return ()
    if not isinstance(value, list):
        raise bad_request("'tools' must be a list of {\"type\": \"function\", \"function\": {...}}")
    tools = []
    for i, t in enumerate(value):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            raise bad_request(f"tools[{i}].function.name must be a non-empty string")
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema (an object)")
        if name in (x.name for x in tools):
            raise bad_request(f"tools[{i}]: two tools are named '{name[:100]}'")
        tools.append(Tool(name, parameters, {"type": "function", "function": {**fn, "parameters": parameters}}))
    return tuple(tools)


def read_choice(value, tools: tuple[Tool, ...]) -> str:
    """OpenAI's tool_choice as "none", "auto", "required" or the name of the one tool to call."""
    if value is None:
        return "auto" if tools else "none"
    if isinstance(value, str):
        if value not in CHOICES:
            raise bad_request(f"'tool_choice' {value[:50]!r} is not one of none, auto, required, or a function")
        chosen = value
    elif isinstance(value, dict) and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str):
        chosen = value["function"]["name"]
        if chosen not in (t.name for t in tools):
            raise bad_request(f"'tool_choice' names function '{chosen[:100]}', which is not in 'tools'")
    else:
        raise bad_request("'tool_choice' must be none, auto, required, or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}")
    if chosen != "none" and not tools:
        raise bad_request(f"'tool_choice' {chosen!r} needs 'tools'")
    return chosen


def selected(tools: tuple[Tool, ...], choice: str) -> tuple[Tool, ...]:
    """The tools a forced call may pick from: all of them, or the one named."""
    return tools if choice in CHOICES else tuple(t for t in tools if t.name == choice)


def as_object(arguments) -> Optional[dict]:
    """Arguments as a dict: OpenAI sends them as a JSON string, Ollama and models as an object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    return arguments if isinstance(arguments, dict) else None
