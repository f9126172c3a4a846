"""What a store holds: a model found (StoredModel), an entry that cannot be used (StoreProblem), and the
check that a file is a GGUF. The readers (folder.py, ollama.py, lmstudio.py) make them; catalog.py looks
them up by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class StoredModel:
    name: str  # Ollama's short form: "qwen3:30b-a3b", "someone/model:q4_k_m"
    path: Path  # the GGUF (an Ollama blob, an LM Studio file...)
    source: str  # ollama | lmstudio | folder | file
    where: str  # what `hypura list` shows: the manifest or the file
    size: int  # bytes (Ollama: every layer of the manifest, as `ollama list` counts)
    modified: float  # the manifest's or file's mtime
    digest: str = ""  # Ollama: sha256 of the manifest, as /api/tags reports it; "" for files
    params: dict = field(default_factory=dict)  # Ollama's params layer: stop, temperature, num_ctx...
    aliases: tuple[str, ...] = ()  # other full names it answers to (before ambiguity is removed)


@dataclass(frozen=True)
class StoreProblem:
    name: str  # the name the entry would have had
    line: str  # why it cannot be used, in one line


def check_gguf(path: Path) -> Optional[str]:
    """Why `path` is not a GGUF file, or None."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        return f"{path}: missing"
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    return None if magic == GGUF_MAGIC else f"{path}: not a GGUF file (starts {magic!r})"
