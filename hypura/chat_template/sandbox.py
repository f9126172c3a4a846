"""Sizes bounded before they are built: what a chat template's operation would make is estimated from
its operands, and the operation refused before Python allocates or computes it.

A deadline checked between operations cannot stop one operation that runs for a minute (`(7 ** 65536) **
256`), and a size checked after an operation has already taken the memory (`'%0200000000d' | format(n)`:
200 MB). So `SizeChecks`, mixed into the chat template's sandbox (render.py), estimates first:

- integers: `a ** b` and `a * b` by their result's bits (`bits(a) * b`, `bits(a) + bits(b)`);
- printf formats (`%` and the `format` filter): every width and precision, written or given by `*`, and
  their sum; `str.format` / `format_map`: each replacement field's spec once its nested fields are
  substituted (`'{:>{}}'.format(n, '200000000')`);
- `tojson`: the indent (at most MAX_INDENT), and the output counted as the encoder writes it;
- what multiplies a string: the `indent`, `replace` and `join` filters, `str.replace`, `str.join`,
  `str.expandtabs`, and `~` (concatenation, compiled to `bounded_concat`).

Each estimate is held to the render's TemplateLimits (`max_chars`, `max_number`) and to MAX_BITS; the
sandbox supplies `_limits()` and `_refuse(message)` (which raises its TemplateError).
"""

from __future__ import annotations

import json
import re
from functools import update_wrapper
from typing import Any, Optional

from jinja2.compiler import CodeGenerator
from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
from markupsafe import Markup

MAX_BITS = 1 << 16  # an integer a template computes: 65,536 bits (~19,700 digits), microseconds per operation
MAX_INDENT = 64  # tojson's indent: chat templates use 2 or 4

# a printf conversion: %(key)flags width .precision length type
_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.S)
# a format spec: [[fill]align][sign][z][#][0][width][grouping][.precision][type]
_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(\d+)?[,_]?(?:\.(\d+))?", re.S)


def _bits(value: Any) -> int:
    return abs(value).bit_length() if isinstance(value, int) and not isinstance(value, bool) else 0


class _BoundedConcat(CodeGenerator):
    """Compiles `a ~ b ~ ...` to `environment.bounded_concat((a, b, ...))` (jinja's is a plain join)."""

    def visit_Concat(self, node, frame) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
            return super().visit_Concat(node, frame)
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class SizeChecks:
    """Mixin for a jinja2 sandbox: estimates before the operations that could build something huge."""

    code_generator_class = _BoundedConcat

    def _limits(self):  # TemplateLimits of the render running on this thread
        raise NotImplementedError

    def _refuse(self, message: str):
        raise NotImplementedError

    # -- operators --------------------------------------------------------------------------------------
    def call_binop(self, context, operator, left, right):
        if operator == "**" and _bits(left) > 1 and isinstance(right, int) and right > 0 \
                and _bits(left) * right > MAX_BITS:
            self._refuse(f"chat template raised a {_bits(left)}-bit number to the power {_short(right)} "
                         f"(results of at most {MAX_BITS} bits)")
        if operator == "*" and _bits(left) + _bits(right) > MAX_BITS:
            self._refuse(f"chat template multiplied numbers into more than {MAX_BITS} bits")
        if operator == "%" and isinstance(left, str):
            self._check_percent(left, right)
        return super().call_binop(context, operator, left, right)

    def bounded_concat(self, items) -> str:
        parts = [str(x) for x in items]  # each is bounded already (and str of a str is itself: no copy)
        self._check_chars(sum(map(len, parts)), "concatenated text")
        return "".join(parts)

    def _check_percent(self, fmt: str, values: Any) -> None:
        """`fmt % values`: every width and precision (written, or taken from `values` by `*`) and their sum."""
        limits = self._limits()
        args = list(values) if isinstance(values, tuple) else [values]
        total, used = len(fmt), 0
        for m in _PERCENT.finditer(fmt):
            for field in m.group(1), m.group(2):
                if field == "*":
                    n = args[used] if used < len(args) else 0
                    used += 1
                else:
                    n = int(field) if field else 0
                if not isinstance(n, int) or abs(n) > limits.max_number:
                    self._refuse(f"chat template formatted with a width of {_short(n)} (at most "
                                 f"{limits.max_number})")
                total += abs(n)
            used += m.group(3) != "%"
        if total > limits.max_chars:
            self._refuse(f"chat template formatted {total} characters (at most {limits.max_chars})")

    # -- calls ------------------------------------------------------------------------------------------
    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        if isinstance(owner, str) and name in ("replace", "join", "expandtabs"):
            if name == "join" and args:
                args = (tuple(args[0]),)  # a generator is read once: read it here, to size it and to join it
            __self._check_string_method(owner, name, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def _check_string_method(self, s: str, name: str, args: tuple, kwargs: dict) -> None:
        if name == "replace" and len(args) >= 2:
            self._check_replace(s, *args[:3])
        elif name == "join" and args:
            self._check_join(args[0], s)
        elif name == "expandtabs":
            size = (args or [kwargs.get("tabsize", 8)])[0]
            self._check_chars(len(s) + s.count("\t") * (size if isinstance(size, int) else 0), "expanded tabs")

    def _check_chars(self, n: int, what: str) -> None:
        if n > self._limits().max_chars:
            self._refuse(f"chat template {what} into {n} characters (at most {self._limits().max_chars})")

    def _check_replace(self, s, old, new, count=-1) -> None:
        if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
            hits = len(s) + 1 if not old else s.count(old)
            hits = hits if not isinstance(count, int) or count < 0 else min(hits, count)
            self._check_chars(len(s) + hits * max(0, len(new) - len(old)), "replaced text")

    def _check_join(self, items, sep) -> None:
        if isinstance(items, (list, tuple)):
            sizes = sum(len(x) if isinstance(x, str) else 32 for x in items)
            self._check_chars(sizes + len(str(sep)) * max(0, len(items) - 1), "joined text")

    # -- str.format -------------------------------------------------------------------------------------
    def wrap_str_format(self, value):
        f_self = getattr(value, "__self__", None)
        if not isinstance(f_self, str) or getattr(value, "__name__", "") not in ("format", "format_map"):
            return super().wrap_str_format(value)
        formatter = (_BoundedEscapeFormatter(self, escape=f_self.escape) if isinstance(f_self, Markup)
                     else _BoundedFormatter(self))
        is_map = value.__name__ == "format_map"

        def wrapper(*args, **kwargs):
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                args, kwargs = (), args[0]
            return type(f_self)(formatter.vformat(f_self, args, kwargs))

        return update_wrapper(wrapper, value)

    def _check_spec(self, spec: str) -> None:
        limits = self._limits()
        m = _SPEC.match(spec)
        for field in (m.groups() if m else ()):
            if field and int(field) > limits.max_number:
                self._refuse(f"chat template formatted with a width of {_short(field)} (at most "
                             f"{limits.max_number})")


class _BoundedFields:
    def format_field(self, value, format_spec):
        self._env._check_spec(format_spec)  # nested fields are substituted by now: the spec is final
        return super().format_field(value, format_spec)


class _BoundedFormatter(_BoundedFields, SandboxedFormatter):
    pass


class _BoundedEscapeFormatter(_BoundedFields, SandboxedEscapeFormatter):
    pass


# -- filters ----------------------------------------------------------------------------------------------
def bounded_filters(env: SizeChecks, filters: dict) -> dict:
    """`filters` with the ones that can multiply their input checked first (jinja's, and tojson)."""
    out = dict(filters)
    fmt, indent, replace, join = (filters.get(k) for k in ("format", "indent", "replace", "join"))

    def format_(value, *args, **kwargs):
        if isinstance(value, str):
            env._check_percent(value, kwargs if kwargs else tuple(args))
        return fmt(value, *args, **kwargs)

    def indent_(s, width=4, first=False, blank=False):
        if isinstance(s, str):
            n = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
            env._check_chars(len(s) + (s.count("\n") + 1) * n, "indented text")
        return indent(s, width, first, blank)

    def replace_(eval_ctx, s, old, new, count=None):
        env._check_replace(s, old, new, -1 if count is None else count)
        return replace(eval_ctx, s, old, new, count)

    def join_(eval_ctx, value, d="", attribute=None):
        if attribute is None and not isinstance(value, (str, list, tuple)):
            value = tuple(value)  # read once, here: to size it and to join it
        if attribute is None:
            env._check_join(value, d)
        return join(eval_ctx, value, d, attribute)

    for name, fn, mine in (("format", fmt, format_), ("indent", indent, indent_), ("replace", replace, replace_),
                           ("join", join, join_)):
        if fn is not None:
            out[name] = update_wrapper(mine, fn)  # keeps jinja's pass_eval_context marks
    return out


def bounded_tojson(env: SizeChecks):
    """transformers' `tojson` (no HTML escaping), its indent bounded and its output counted as written."""

    def tojson(x: Any, ensure_ascii: bool = False, indent: Optional[Any] = None, separators=None,
               sort_keys: bool = False) -> str:
        width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        if width > MAX_INDENT:
            env._refuse(f"chat template asked tojson for an indent of {_short(width)} (at most {MAX_INDENT})")
        encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                   sort_keys=sort_keys)
        limit, parts, n = env._limits().max_chars, [], 0
        for part in encoder.iterencode(x):
            n += len(part)
            if n > limit:
                env._refuse(f"chat template's tojson wrote more than {limit} characters")
            parts.append(part)
        return "".join(parts)

    return tojson


def _short(value: Any, limit: int = 40) -> str:
    text = str(value) if not isinstance(value, int) or _bits(value) < 128 else f"<{_bits(value)}-bit number>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
