"""Sizes as users type them ("8GiB", "24GB") and as Hypura prints them."""

from __future__ import annotations

import re

from hypura.errors import HypuraError

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mib": 1 << 20,
          "mb": 10**6, "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """"8GiB", "512MiB", "24GB" (decimal), "8G" (binary, like llama.cpp's sizes), "0", bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise HypuraError(f"bad size {text!r}: use a number with B, KiB, MiB, GiB, TiB, KB, MB, GB or TB")
    return int(float(m.group(1)) * _UNITS[unit])


def fmt_mib(n: int) -> str:
    """A size as a flag takes it, rounded up to a MiB: `1255MiB`."""
    return f"{-(-n // (1 << 20))}MiB"


def fmt_size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
