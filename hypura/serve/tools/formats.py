"""How a model writes tool calls, chosen from its chat template (as llama.cpp's common/chat.cpp chooses):

    hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call (Hermes, Qwen 2.5/3)
    mistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]                     (Mistral, Mixtral)
    llama3   {"name": ..., "parameters": {...}} as the whole reply, after an optional <|python_tag|>
    generic  a template that never mentions tools: they are described in a system message, and a call is
             the whole reply as {"tool_calls": [{"name": ..., "arguments": {...}}]}

A format parses a finished reply into its text and its calls, and makes the grammar that forces a call
(tool_choice "required" or a named function). Calls naming no offered tool are left as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

from hypura.serve.generate.grammars import schema_rules
from hypura.serve.tools import Tool, ToolCall, as_object

HERMES_MARKER, MISTRAL_MARKER = "<tool_call>", "[TOOL_CALLS]"
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


@dataclass(frozen=True)
class ToolFormat:
    name: str
    native: bool  # the template renders `tools` itself
    marker: Optional[str]  # calls begin at this string anywhere in a reply; None: only a reply that is JSON
    args_key: str = "arguments"  # the arguments' key in a call object

    def parse(self, text: str, tools: tuple[Tool, ...]) -> tuple[str, list[ToolCall]]:
        """(text left for the user, calls); a reply whose calls do not parse is all text."""
        if self.marker is not None:
            at = text.find(self.marker)
            if at < 0:
                return text, []
            head, tail = text[:at], text[at:]
        else:
            head, tail = "", text.strip()
            tail = tail.removeprefix("<|python_tag|>")
            fenced = _FENCE.match(tail)
            tail = fenced.group(1) if fenced else tail
        if self.marker == MISTRAL_MARKER:
            tail = tail[len(MISTRAL_MARKER):]
        calls, content = _calls(_json_values(tail, self.marker == HERMES_MARKER), tools, self.args_key)
        if calls is None:
            return text, []
        return (head + content).strip(), calls

    def grammar(self, tools: tuple[Tool, ...], parallel: bool) -> str:
        """GBNF that lets the model write only calls of `tools` (one, or one or more when `parallel`)."""
        call = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, self.args_key: t.parameters},
                           "required": ["name", self.args_key]} for t in tools]}
        if self.name == "generic":
            array = {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
            return schema_rules({"type": "object", "properties": {"tool_calls": array}, "required": ["tool_calls"]},
                                "tools")
        rules = schema_rules(call, "tools", "call")
        if self.marker == HERMES_MARKER:
            block = '"<tool_call>\\n" call "\\n</tool_call>"'
            root = f'{block} ("\\n" {block})*' if parallel else block
        elif self.marker == MISTRAL_MARKER:
            root = '"[TOOL_CALLS][" call ("," call)* "]"' if parallel else '"[TOOL_CALLS][" call "]"'
        else:
            root = "call"
        return f"root ::= {root}\n{rules}"


HERMES = ToolFormat("hermes", True, HERMES_MARKER)
MISTRAL = ToolFormat("mistral", True, MISTRAL_MARKER)
LLAMA3 = ToolFormat("llama3", True, None, "parameters")
GENERIC = ToolFormat("generic", False, None)


def detect(template_source: str) -> ToolFormat:
    """The format a template implies; GENERIC when it does not render tools."""
    if "tools" not in template_source:
        return GENERIC
    if "<tool_call>" in template_source:
        return HERMES
    if "[TOOL_CALLS]" in template_source:
        return MISTRAL
    if "<|start_header_id|>" in template_source or "<|python_tag|>" in template_source:
        return LLAMA3
    return ToolFormat("json", True, None)  # renders tools in a way of its own: a call is a JSON reply


def _json_values(text: str, blocks: bool) -> list:
    """Every JSON value in `text` (hermes: one per <tool_call> block), or [] when any part is not JSON."""
    if blocks:
        parts = [p.split("</tool_call>")[0] for p in text.split("<tool_call>")[1:]] if "<tool_call>" in text \
            else [text]
    else:
        parts = [text]
    values, decoder = [], json.JSONDecoder()
    for part in parts:
        rest = part.strip()
        while rest:
            try:
                value, end = decoder.raw_decode(rest)
            except json.JSONDecodeError:
                return []
            values.append(value)
            rest = rest[end:].strip().lstrip(";,").strip()
    return values


def _calls(values: list, tools: tuple[Tool, ...], args_key: str) -> tuple[Optional[list[ToolCall]], str]:
    """The calls the JSON values hold (None if any is not a call of an offered tool), and a generic
    format's plain `response`."""
    names = {t.name for t in tools}
    items, content = [], ""
    for v in values:
        if isinstance(v, dict) and isinstance(v.get("response"), str) and len(v) == 1:
            content += v["response"]
            continue
        if isinstance(v, dict) and isinstance(v.get("tool_calls"), list):
            items.extend(v["tool_calls"])
        elif isinstance(v, dict) and isinstance(v.get("tool_call"), dict):
            items.append(v["tool_call"])
        elif isinstance(v, list):
            items.extend(v)
        else:
            items.append(v)
    calls = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("function"), dict):
            item = item["function"]
        if not isinstance(item, dict) or item.get("name") not in names:
            return None, ""
        arguments = as_object(item.get(args_key, item.get("arguments", item.get("parameters", {}))))
        if arguments is None:
            return None, ""
        calls.append(ToolCall.make(item["name"], arguments))
    if not calls and not content:
        return None, ""
    return calls, content


def describe(tools: tuple[Tool, ...], choice: str) -> str:
    """The system message that offers tools to a model whose template does not (the generic format): one
    line a tool, its signature and the first line of its description. Compact: clients send dozens of tools
    (Open WebUI's built-in ones are over 6000 tokens as JSON schemas), and a forced call's grammar holds
    the exact schemas anyway."""
    must = "You must call a tool." if choice != "auto" else \
        "If a tool helps, call it; otherwise answer the user normally, in plain text."
    lines = "\n".join(_signature(t) for t in tools)
    return (f"You can call these tools:\n{lines}\n{must} To call tools, reply with only this JSON object: "
            '{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]}')


DESCRIPTION_CHARS = 160  # of a tool's description in the generic prompt


def _signature(tool: Tool) -> str:
    properties = tool.parameters.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = tool.parameters.get("required")
    required = set(required) if isinstance(required, list) else set()
    args = ", ".join(f"{k}{'' if k in required else '?'}: {_type(v)}" for k, v in properties.items())
    lines = str(tool.spec["function"].get("description") or "").strip().splitlines()
    about = lines[0][:DESCRIPTION_CHARS] if lines else ""
    return f"- {tool.name}({args})" + (f": {about}" if about else "")


def _type(schema) -> str:
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("enum"), list):
        return " | ".join(json.dumps(e) for e in schema["enum"][:8])
    if isinstance(schema.get("anyOf"), list):
        return " | ".join(_type(s) for s in schema["anyOf"][:4])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"{_type(schema.get('items'))}[]"
    return " | ".join(map(str, kind)) if isinstance(kind, list) else str(kind)
