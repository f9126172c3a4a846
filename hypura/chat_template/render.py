"""A GGUF's chat template, rendered as llama-cpp-python renders it, but only inside a bounded sandbox.

The template is the model file's `tokenizer.chat_template`: Jinja written by whoever made the file,
so it is untrusted. It is parsed and rendered by jinja2's `ImmutableSandboxedEnvironment` (no
attribute that starts with `_`, no `__class__`/`__globals__` walk, no mutation of lists or dicts),
with the variables, filters and extensions llama-cpp-python's `Jinja2ChatFormatter` gives it
(`messages`, `bos_token`, `eos_token`, `add_generation_prompt`, `tools`, `raise_exception`,
`strftime_now`, `tojson`, `{% generation %}`, loop controls). On top of the sandbox a render is bounded:
a wall-clock deadline checked at every call, attribute and item access, filter and `range` step; a
budget of `range` items; numbers passed to calls and filters, `*`/`**`/`%` results and format widths
capped; the output capped. A template that breaks any of this, or fails to parse or render, raises
TemplateError with one printable line; `raise_exception(...)` in the template raises TemplateRejected
(the conversation, not the server, is at fault).

Sizes are estimated before the operation that would build them (sandbox.py): a power, a format
width, a repetition, a concatenation over its bound is refused before it allocates or computes anything.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Optional

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hypura.errors import HypuraError
from hypura.chat_template.sandbox import SizeChecks, bounded_filters, bounded_tojson

METADATA_KEY = "tokenizer.chat_template"


class TemplateError(HypuraError):
    """A chat template that does not parse, or failed or ran out of bounds while rendering."""


class TemplateRejected(TemplateError, ValueError):
    """The template's own `raise_exception(...)`: it refuses this conversation (e.g. roles out of order). A
    ValueError too, as llama-cpp-python's Jinja2ChatFormatter raises it."""


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds on one render. Real templates (a 100-message chat) stay orders of magnitude below each."""

    seconds: float = 2.0  # wall clock; real templates render in about a millisecond
    range_items: int = 1_000_000  # items all `range()` loops of one render may yield together
    max_number: int = 1 << 16  # largest int argument of a call or filter, width in a format string
    max_chars: int = 4 << 20  # output, and any string or list a `*`/`+` makes; 4 Mi chars ~ 1M tokens


_RENDERING = threading.local()  # the bounds of the render running on this thread (renders run on worker threads)


class _Bounds:
    def __init__(self, limits: TemplateLimits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.range_items = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"chat template ran longer than {self.limits.seconds:g} s")

    def number(self, value: Any) -> None:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.limits.max_number:
            raise TemplateError(f"chat template used the number {_short(value)} (at most {self.limits.max_number})")

    def size(self, value: Any) -> Any:
        if isinstance(value, (str, list, tuple)) and len(value) > self.limits.max_chars:
            raise TemplateError(f"chat template made a value of {len(value)} items (at most {self.limits.max_chars})")
        return value

    def __enter__(self) -> "_Bounds":
        _RENDERING.bounds = self
        return self

    def __exit__(self, *exc) -> None:
        _RENDERING.bounds = None


def _bounds() -> _Bounds:
    """The bounds of this thread's parse or render (parsing folds constant filter calls: they count too)."""
    return _RENDERING.bounds


# width / precision fields of %-formats and of str.format specs
_PERCENT_WIDTHS = re.compile(r"%[#0\- +]*(\d*)(?:\.(\d+))?")
_FORMAT_WIDTHS = re.compile(r"\{[^{}]*:[^{}\d]*(\d+)(?:\.(\d+))?")


def _check_format(bounds: _Bounds, fmt: str, pattern: re.Pattern) -> None:
    for m in pattern.finditer(fmt):
        for field in m.groups():
            if field:
                bounds.number(int(field))


class _Sandbox(SizeChecks, ImmutableSandboxedEnvironment):
    """The sandbox with every hook a render passes through bounded (sizes before they are built: SizeChecks)."""

    intercepted_binops = frozenset(["*", "**", "%", "+"])

    def _limits(self) -> TemplateLimits:
        return _bounds().limits

    def _refuse(self, message: str):
        raise TemplateError(message)

    def call_binop(self, context, operator, left, right):
        bounds = _bounds()
        bounds.tick()
        if operator == "**":
            bounds.number(right)
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) \
                        and len(seq) * n > bounds.limits.max_chars:
                    raise TemplateError(f"chat template repeated a value {_short(n)} times (at most "
                                        f"{bounds.limits.max_chars} items)")
        elif operator == "%" and isinstance(left, str):
            _check_format(bounds, left, _PERCENT_WIDTHS)
        return bounds.size(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        bounds = _bounds()
        bounds.tick()
        if __obj is not _bounded_range:
            for value in (*args, *kwargs.values()):
                bounds.number(value)
        return bounds.size(super().call(__context, __obj, *args, **kwargs))

    def getattr(self, obj, attribute):
        _bounds().tick()
        return self._checked_format(super().getattr(obj, attribute))

    def getitem(self, obj, argument):
        _bounds().tick()
        return self._checked_format(super().getitem(obj, argument))

    @staticmethod
    def _checked_format(value):
        # str.format / format_map come back wrapped by the sandbox; their format string is the bound method's self
        inner = getattr(value, "__wrapped__", None)
        if isinstance(getattr(inner, "__self__", None), str) and \
                getattr(inner, "__name__", "") in ("format", "format_map"):
            _check_format(_bounds(), inner.__self__, _FORMAT_WIDTHS)
        return value


def _bounded_range(*args: int):
    bounds = _bounds()
    for item in range(*args):  # lazy: a huge range costs only the items a loop takes, each counted
        bounds.range_items += 1
        if bounds.range_items > bounds.limits.range_items:
            raise TemplateError(f"chat template looped over more than {bounds.limits.range_items} range items")
        bounds.tick()
        yield item


def _bounded_filter(fn):
    @functools.wraps(fn)  # keeps jinja's pass_context / pass_environment marks
    def run(*args, **kwargs):
        bounds = _bounds()
        bounds.tick()
        for value in (*args, *kwargs.values()):
            bounds.number(value)
        return bounds.size(fn(*args, **kwargs))

    return run


class _IgnoreGeneration(jinja2.ext.Extension):
    """HuggingFace's `{% generation %}...{% endgeneration %}` tag renders its body (as llama-cpp-python)."""

    tags = {"generation"}

    def parse(self, parser):
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _raise_exception(message: str):
    raise TemplateRejected(f"chat template refused the conversation: {_short(message)}")


def _environment() -> _Sandbox:
    env = _Sandbox(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                   extensions=[_IgnoreGeneration, jinja2.ext.loopcontrols])
    env.filters["tojson"] = bounded_tojson(env)  # transformers' (and llama-cpp-python's): no HTML escaping
    env.filters = {name: _bounded_filter(fn) for name, fn in bounded_filters(env, env.filters).items()}
    env.globals.pop("lipsum", None)  # lipsum(n) makes n paragraphs: no chat template needs it
    env.globals["range"] = _bounded_range
    return env


def _short(value: Any, limit: int = 200) -> str:
    """A value as one printable line of at most `limit` characters."""
    text = "".join(c if c.isprintable() else " " for c in str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ChatTemplate:
    """A parsed chat template; `render` turns a conversation into the prompt text."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "",
                 limits: TemplateLimits = TemplateLimits()):
        if not isinstance(source, str) or not source.strip():
            raise TemplateError("chat template is empty")
        self.source, self.bos_token, self.eos_token, self.limits = source, bos_token, eos_token, limits
        try:
            with _Bounds(limits):
                self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template does not parse: line {e.lineno}: {_short(e.message)}") from None
        except TemplateError:
            raise
        except Exception as e:  # constant folding runs filters at parse time; anything they raise is the template's
            raise TemplateError(f"chat template does not parse: {type(e).__name__}: {_short(e)}") from None

    def render(self, messages: Iterable[dict], add_generation_prompt: bool = True, tools: Optional[list] = None,
               functions: Optional[list] = None, function_call: Any = None, tool_choice: Any = None,
               **extra: Any) -> str:
        """The prompt for `messages` ([{"role": ..., "content": ...}, ...]), with llama-cpp-python's variables
        (functions, function_call, tool_choice: what a chat completion passed) and `extra` ones (e.g.
        enable_thinking). Raises TemplateError."""
        context = dict(messages=list(messages), bos_token=self.bos_token, eos_token=self.eos_token,
                       add_generation_prompt=add_generation_prompt, tools=tools, functions=functions,
                       function_call=function_call, tool_choice=tool_choice, raise_exception=_raise_exception,
                       strftime_now=_strftime_now, **extra)
        try:
            with _Bounds(self.limits) as bounds:
                return self._generate(context, bounds)
        except TemplateError:
            raise
        except RecursionError:
            raise TemplateError("chat template recursed too deeply") from None
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {_short(e.message or type(e).__name__)}") from None
        except Exception as e:  # whatever the template's code raised: its fault, reported as one line
            raise TemplateError(f"chat template failed: {type(e).__name__}: {_short(e)}") from None

    def _generate(self, context: dict, bounds: _Bounds) -> str:
        out, n = [], 0
        for chunk in self._template.generate(**context):
            n += len(chunk)
            if n > self.limits.max_chars:
                raise TemplateError(f"chat template output is longer than {self.limits.max_chars} characters")
            bounds.tick()
            out.append(chunk)
        return "".join(out)
