"""Ollama's keep_alive: how long a model stays loaded after its last request (request field, --keep-alive,
$OLLAMA_KEEP_ALIVE; 5 minutes by default). Parsed as Ollama parses it: a number of seconds, or a Go
duration string ("10m", "1h30m", "0.5s", "0"); a negative value keeps the model loaded; 0 unloads it as
soon as its requests end."""

from __future__ import annotations

import math
import re

DEFAULT_S = 300.0  # Ollama's envconfig default, 5m
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class KeepAliveError(ValueError):
    pass


def parse_keep_alive(value) -> float:
    """Seconds (math.inf: never unloaded) from a number or a duration string; KeepAliveError if neither."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise KeepAliveError(f"keep_alive {str(value)[:40]!r}: want seconds or a duration such as \"5m\"")
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(int(text))  # $OLLAMA_KEEP_ALIVE accepts plain seconds too
        except ValueError:
            seconds = _duration(text)
    else:
        seconds = float(value)
    if math.isnan(seconds):
        raise KeepAliveError("keep_alive is NaN")
    return math.inf if seconds < 0 else seconds


def _duration(text: str) -> float:
    """Go's time.ParseDuration: [-+]? then one or more number+unit, or "0"."""
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return 0.0
    parts = _PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise KeepAliveError(f"keep_alive {text[:40]!r}: want seconds or a duration such as \"5m\" or \"1h30m\"")
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)
