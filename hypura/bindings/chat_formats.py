"""The chat handlers of a model's own templates and the chat format `create_chat_completion` uses, chosen as
llama-cpp-python's `Llama` chooses them: the format asked for, else one guessed from the GGUF template, else
the template itself, else "llama-2". A model's template renders through hypura.chat_template (the server's
bounded renderer), not llama-cpp-python's unbounded Jinja2ChatFormatter: a template that would run for
minutes raises TemplateError at the chat completion instead."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional

import llama_cpp.llama_chat_format as llama_chat_format
from llama_cpp.llama import StoppingCriteriaList

from hypura.chat_template import ChatTemplate, TemplateError

_PREFIX = "tokenizer.chat_template"


@dataclass
class ChatFormats:
    chat_format: Optional[str]
    handlers: dict = field(default_factory=dict)  # template name -> handler, of the model's metadata


def chat_formats(metadata: dict, chat_format: Optional[str], chat_handler, eos_id: int, bos_id: int,
                 token_text, verbose: bool) -> ChatFormats:
    """metadata: the GGUF's key -> value; token_text(id) -> a token's text (for the templates' eos/bos)."""
    eos, bos = (token_text(eos_id) if eos_id != -1 else ""), (token_text(bos_id) if bos_id != -1 else "")
    templates = {name[len("tokenizer."):]: t for name, t in metadata.items() if name.startswith(_PREFIX + ".")}
    if _PREFIX in metadata:
        templates["chat_template.default"] = metadata[_PREFIX]
    say = (lambda line: print(line, file=sys.stderr)) if verbose else (lambda line: None)
    if templates:
        say(f"Available chat formats from metadata: {', '.join(templates)}")
    handlers = {name: BoundedChatFormatter(t, eos, bos, [eos_id]).to_chat_handler() for name, t in templates.items()}
    if chat_format is None and chat_handler is None and "chat_template.default" in templates:
        chat_format = llama_chat_format.guess_chat_format_from_gguf_metadata(metadata)
        if chat_format is not None:
            say(f"Guessed chat format: {chat_format}")
        else:
            say(f"Using gguf chat template: {templates['chat_template.default']}")
            say(f"Using chat eos_token: {eos}")
            say(f"Using chat bos_token: {bos}")
            chat_format = "chat_template.default"
    if chat_format is None and chat_handler is None:
        chat_format = "llama-2"
        say(f"Using fallback chat format: {chat_format}")
    return ChatFormats(chat_format, handlers)


class BoundedChatFormatter(llama_chat_format.ChatFormatter):
    """llama-cpp-python's Jinja2ChatFormatter (same variables, same response) over the bounded ChatTemplate. A
    template that does not parse, or is refused while parsing, loads all the same (completions need no
    template) and raises its TemplateError at each chat completion."""

    def __init__(self, template: str, eos_token: str, bos_token: str, stop_token_ids: list[int]):
        self.eos_token, self.stop_token_ids = eos_token, set(stop_token_ids)
        try:
            self._template, self._error = ChatTemplate(template, bos_token, eos_token), None
        except TemplateError as e:
            self._template, self._error = None, str(e)

    def __call__(self, *, messages, functions=None, function_call=None, tools=None, tool_choice=None,
                 **kwargs) -> llama_chat_format.ChatFormatterResponse:
        if self._template is None:
            raise TemplateError(self._error)
        prompt = self._template.render(messages, True, tools, functions, function_call, tool_choice, **kwargs)
        stop_ids = self.stop_token_ids
        return llama_chat_format.ChatFormatterResponse(
            prompt=prompt, stop=[self.eos_token], added_special=True,
            stopping_criteria=StoppingCriteriaList([lambda tokens, logits: tokens[-1] in stop_ids]))

    def to_chat_handler(self) -> llama_chat_format.LlamaChatCompletionHandler:
        return llama_chat_format.chat_formatter_to_chat_completion_handler(self)
