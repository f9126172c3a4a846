"""A GGUF's chat template, rendered in a bounded sandbox: the one renderer of `hypura serve` and of
`hypura.Llama.create_chat_completion` (hypura.bindings.chat_formats), so a model file whose template
would run for minutes or take gigabytes is refused in bounded time and memory, whoever renders it.

    render.py   ChatTemplate: parse and render as llama-cpp-python's Jinja2ChatFormatter does, bounded in
                time, items, numbers and output (TemplateLimits); TemplateError, TemplateRejected
    sandbox.py  SizeChecks: each operation that could build something huge sized before it runs

Needs only jinja2 (llama-cpp-python's). `hypura-cli`'s chat mode runs no Jinja: libllama's built-in
templates, as llama-completion without --jinja (hypura.cli.completion.chat).
"""

from hypura.chat_template.render import METADATA_KEY, ChatTemplate, TemplateError, TemplateLimits, TemplateRejected

__all__ = ["METADATA_KEY", "ChatTemplate", "TemplateError", "TemplateLimits", "TemplateRejected"]
