"""Plans and profiles as JSON files: parsed with one-line errors (written by hypura.cachefile.write_atomic)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypura.errors import HypuraError


def parse_json(text: str | bytes, what: str) -> dict:
    """One JSON object; anything else (not JSON, torn, not UTF-8, a list) is one line naming `what`."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise HypuraError(f"{what} is not JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise HypuraError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not isinstance(d, dict):
        raise HypuraError(f"{what} is not a JSON object (a {type(d).__name__})")
    return d


def read_json_file(path: str | os.PathLike, what: str) -> dict:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise HypuraError(f"cannot read {what} {p}: {e.strerror}") from None
    try:
        return parse_json(data, what)
    except HypuraError as e:
        raise HypuraError(f"{p}: {e}") from None
