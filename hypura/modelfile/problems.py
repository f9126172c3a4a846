"""One-line problem reports about a model file: which field, what it holds, what was expected.

A file's own bytes end up in these messages (keys, tensor names, string values), and a corrupt
file can hold anything there: a name read with a bogus length was once 62 million characters.
So every value is shown printable, on one line and at most MAX_SHOWN characters long.
"""

from __future__ import annotations

import math

MAX_SHOWN = 80  # characters of a value quoted in a message
MAX_FIELD = 160  # characters of a field's name (the keys and tensor names in it are cut shorter where read)


class Name(str):
    """A word of the message's own (a type name, "missing"): shown as is, not quoted as the file's text."""


class Problem(Exception):
    """What is wrong with the file, as one line (str())."""


class Invalid(Problem):
    """A field of the file breaks a condition llama.cpp (or Hypura) relies on."""

    def __init__(self, field: str, value, expected: str):
        self.field, self.value, self.expected = clip(field, MAX_FIELD), value, expected  # a field quotes names
        super().__init__(f"{self.field} is {shown(value)}: expected {expected}")


class Truncated(Problem):
    """A field runs past the end of the file."""

    def __init__(self, field: str, detail: str):
        self.field = clip(field, MAX_FIELD)
        super().__init__(f"corrupt or truncated GGUF file: {self.field} {detail}")


def _printable(text: str) -> str:
    out = []
    for ch in text:
        if ch.isprintable() and ch not in "\\":
            out.append(ch)
        elif ch == "\\":
            out.append("\\\\")
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def clip(text: str, limit: int = MAX_SHOWN) -> str:
    """`text` printable and at most `limit` characters ("..." marks a cut). Only its first `limit`
    characters are looked at: a bogus length can make a name tens of megabytes long."""
    shown = _printable(text[:limit])
    return shown if len(text) <= limit and len(shown) <= limit else shown[: limit - 3] + "..."


def shown(value) -> str:
    """A value of the file as a message quotes it: strings quoted, floats as C prints them."""
    if isinstance(value, Name):
        return clip(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return "'" + clip(value, MAX_SHOWN - 2) + "'"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return clip(str(value))
