"""Plans and profiles as JSON files: parsed with one-line errors, written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypura.errors import HypuraError


def parse_json(text: str, what: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise HypuraError(f"{what} is not JSON ({e})") from None


def read_json_file(path: str | os.PathLike, what: str) -> dict:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise HypuraError(f"cannot read {what} {p}: {e.strerror}") from None
    try:
        return parse_json(text, what)
    except HypuraError as e:
        raise HypuraError(f"{p}: {e}") from None


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """A reader never sees half a file: write beside it, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
