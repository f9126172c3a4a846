"""Files this machine makes for itself (the machine profile, the CPU's rates per model, recorded routing) and files
it hands out (plans): written whole or not at all; a cache that cannot be read back is warned of once, removed and
made again, never a traceback."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hypura.errors import HypuraError

T = TypeVar("T")


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """A reader never sees half a file, nor does a crash leave one: write beside it, flush it to the disk, then
    rename it over the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_cache(path: str | os.PathLike, what: str, parse: Callable[[bytes], T]) -> T | None:
    """`parse` of the cache file's bytes; None where there is none, or where it is corrupt or truncated (what
    `parse` raised, said in one warning): the file is removed, so its next writer makes it again."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # none made yet (a folder of the path may be a file)
        return None
    except OSError as e:
        warnings.warn(f"hypura: {what} {path} is unreadable ({e.strerror}): ignored", stacklevel=2)
        return None
    try:
        return parse(data)
    except Exception as e:  # whatever a torn or garbled file makes a parser raise: a cache is made again
        why = str(e) if isinstance(e, HypuraError) else f"{type(e).__name__}: {e}"
        warnings.warn(f"hypura: {what} {path} is corrupt ({why}): ignored and made again", stacklevel=2)
        try:
            path.unlink()
        except OSError:
            pass  # not ours to remove: read again, warned again, next time
        return None
