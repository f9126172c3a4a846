"""common/chat.cpp without --jinja, for `hypura-cli`: libllama's built-in chat templates."""

from __future__ import annotations

import ctypes
from typing import Optional

import llama_cpp

from hypura.errors import HypuraError


# common/chat.cpp's fallback when the model has none (a jinja source llama.cpp detects as chatml)
CHATML_TEMPLATE_SRC = (
    b"{%- for message in messages -%}\n"
    b"  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    b"{%- endfor -%}\n"
    b"{%- if add_generation_prompt -%}\n"
    b"  {{- '<|im_start|>assistant\n' -}}\n"
    b"{%- endif -%}"
)


class BuiltinChatTemplate:
    """common_chat_templates with use_jinja = false (llama-completion's default): messages are
    formatted by libllama's built-in templates (llama_chat_apply_template), chosen from the
    model's template source the way llama.cpp chooses them."""

    def __init__(self, model, override: Optional[bytes]):
        self.has_explicit_template = bool(override)
        src = override or b""
        if not override:
            default = llama_cpp.llama_model_chat_template(model, None)
            tool_use = llama_cpp.llama_model_chat_template(model, b"tool_use")
            if default:
                src, self.has_explicit_template = default, True
            if tool_use:
                self.has_explicit_template = True
            if not src or src == b"chatml":
                src = tool_use or CHATML_TEMPLATE_SRC
        elif src == b"chatml":
            src = CHATML_TEMPLATE_SRC
        self.source = src
        if override:  # common_chat_verify_template, as llama.cpp checks --chat-template at parse time
            try:
                self.apply([(b"user", b"test")], True)
            except HypuraError:
                raise HypuraError(
                    f"the supplied chat template is not supported: {override.decode('utf-8', 'replace')!r} "
                    "(without --jinja, only commonly used templates are supported)"
                ) from None

    def apply(self, messages: list[tuple[bytes, bytes]], add_generation_prompt: bool) -> bytes:
        chat = (llama_cpp.llama_chat_message * max(len(messages), 1))(
            *[llama_cpp.llama_chat_message(role, content) for role, content in messages]
        )
        size = sum(len(r) + len(c) for r, c in messages)
        buf = ctypes.create_string_buffer(max(size + size // 4, 1))
        n = llama_cpp.llama_chat_apply_template(self.source, chat, len(messages), add_generation_prompt, buf, len(buf))
        if n < 0:
            raise HypuraError("this custom template is not supported, try using --jinja")
        if n > len(buf):
            buf = ctypes.create_string_buffer(n)
            n = llama_cpp.llama_chat_apply_template(self.source, chat, len(messages), add_generation_prompt, buf, len(buf))
        return buf.raw[:n]

    def format_single(self, past: list[tuple[bytes, bytes]], new: tuple[bytes, bytes], add_ass: bool) -> bytes:
        """common_chat_format_single: the text `new` adds after `past`."""
        fmt_past = self.apply(past, False) if past else b""
        prefix = b"\n" if add_ass and fmt_past.endswith(b"\n") else b""
        fmt_new = self.apply(past + [new], add_ass)
        return prefix + fmt_new[len(fmt_past):]

    def example(self) -> bytes:
        return self.apply([(b"system", b"You are a helpful assistant"), (b"user", b"Hello"),
                           (b"assistant", b"Hi there"), (b"user", b"How are you?")], False)
