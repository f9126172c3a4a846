"""A reply split as it streams into thinking, text and tool calls.

Pieces of generated text go in (`push`); what can be shown at once comes out as a Delta. Thinking is
the text inside `<think>...</think>` (a template whose prompt ends inside the tag starts there). Text
that may begin a tool call (the format's marker, or a reply that opens as JSON) is held back until the
end, where `finish` parses it: calls, or the held text after all. A piece that may be the start of a
tag or a marker is held back only until the next piece settles it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hypura.serve.tools import Tool, ToolCall
from hypura.serve.tools.formats import ToolFormat

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_JSON_STARTS = ("{", "```", "<|python_tag|>", "[")


@dataclass(frozen=True)
class Delta:
    thinking: str = ""
    content: str = ""


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReplyStream:
    def __init__(self, think: bool, starts_thinking: bool = False, tool_format: Optional[ToolFormat] = None,
                 tools: tuple[Tool, ...] = ()):
        self.think, self.in_think = think, think and starts_thinking
        self.format, self.tools = (tool_format, tools) if tools else (None, ())
        self._pending = ""  # text not yet split between thinking and content
        self._strip = self.in_think  # drop the whitespace after a tag, however the pieces cut it
        self._seen_content = False  # content began: a later <think> is text
        self._content = ""  # content not yet released (may begin a call)
        self._held = False  # the content from here on is a call, parsed at the end

    def push(self, text: str) -> Delta:
        thinking, content = self._split_thinking(text, final=False)
        return Delta(thinking, self._release(content, final=False))

    def finish(self) -> tuple[Delta, list[ToolCall]]:
        thinking, content = self._split_thinking("", final=True)
        content = self._release(content, final=True)
        calls: list[ToolCall] = []
        if self._held:
            text, calls = self.format.parse(self._content, self.tools)
            content += text
        return Delta(thinking, content), calls

    def _split_thinking(self, text: str, final: bool) -> tuple[str, str]:
        if not self.think:
            return "", text
        self._pending += text
        thinking, content = "", ""
        while self._pending:
            if self._strip:
                self._pending = self._pending.lstrip()
                self._strip = not self._pending
                continue
            if self.in_think:
                at = self._pending.find(THINK_CLOSE)
                if at >= 0:
                    thinking += self._pending[:at]
                    self._pending = self._pending[at + len(THINK_CLOSE):]
                    self.in_think, self._strip = False, True
                    continue
                keep = 0 if final else _partial_suffix(self._pending, THINK_CLOSE)
                thinking += self._pending[:len(self._pending) - keep]
                self._pending = self._pending[len(self._pending) - keep:]
                break
            stripped = self._pending.lstrip()
            if not self._seen_content and stripped.startswith(THINK_OPEN):
                self.in_think, self._pending, self._strip = True, stripped[len(THINK_OPEN):], True
                continue
            if not self._seen_content and not final and THINK_OPEN.startswith(stripped):
                break  # maybe the opening tag: wait for more
            content += self._pending
            self._seen_content, self._pending = True, ""
        return thinking, content

    def _release(self, text: str, final: bool) -> str:
        """What of the content can be shown now; the rest is kept in self._content."""
        if self.format is None:
            return text
        self._content += text
        if self._held:
            return ""
        if self.format.marker is not None:
            at = self._content.find(self.format.marker)
            if at >= 0:
                out, self._content, self._held = self._content[:at], self._content[at:], True
                return out
            keep = 0 if final else _partial_suffix(self._content, self.format.marker)
        else:  # a call is the whole reply: decided by how it opens
            stripped = self._content.lstrip()
            if stripped.startswith(_JSON_STARTS):
                self._held = True
                return ""
            undecided = not stripped or any(s.startswith(stripped) for s in _JSON_STARTS)
            keep = len(self._content) if undecided and not final else 0
            if not keep:
                self.format = None  # plain text: no call can follow
        out = self._content[:len(self._content) - keep]
        self._content = self._content[len(self._content) - keep:]
        return out
