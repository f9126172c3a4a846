"""What a user types where a model is named (hypura-cli -m, hypura.Llama, inspect, serve -m): a file path
as before, else a model name looked up in the stores. Something that looks like a path (ends in .gguf,
starts with / . ~) stays a path even when missing, so that its error is the file's."""

from __future__ import annotations

import os
from pathlib import Path

from hypura.store.catalog import Catalog
from hypura.store.stored import StoredModel
from hypura.store.folder import stored_file


def looks_like_path(spec: str) -> bool:
    return spec.lower().endswith(".gguf") or spec.startswith(("/", ".", "~"))


def resolve_model(spec, models_dir=None) -> StoredModel:
    """The model `spec` names: a path (a file, or path-like), else a store's model; HypuraError in one line
    (with close matches) when neither."""
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if isinstance(spec, os.PathLike) or path.is_file() or looks_like_path(text):
        return stored_file(path, "file") if path.is_file() else _missing(path)
    return Catalog.scan(models_dir).find(text)


def resolve_path(spec, models_dir=None) -> Path:
    """As resolve_model, the GGUF's path."""
    return resolve_model(spec, models_dir).path


def _missing(path: Path) -> StoredModel:
    """A path-like spec that is no file: read_header says so in its own words, later."""
    return StoredModel(name=path.name, path=path, source="file", where=str(path), size=0, modified=0.0)
