"""A plain folder of GGUF files (--models-dir, $HYPURA_MODELS), subfolders included: each file is named
from its stem (names.file_name), and answers to `name` alone too while no other model claims it."""

from __future__ import annotations

from pathlib import Path

from hypura.store.stored import StoredModel, StoreProblem, check_gguf
from hypura.store.names import DEFAULT_TAG, file_name


def gguf_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix.lower() == ".gguf" and p.is_file()) if root.is_dir() else []


def stored_file(path: Path, source: str, namespace: str = "") -> StoredModel:
    base, tag = file_name(path.name[:-len(".gguf")] if path.name.lower().endswith(".gguf") else path.name)
    prefix = f"{namespace}/" if namespace else ""
    aliases = {f"{prefix}{base}:{DEFAULT_TAG}", f"{base}:{tag}", f"{base}:{DEFAULT_TAG}"} - {f"{prefix}{base}:{tag}"}
    st = path.stat()
    return StoredModel(name=f"{prefix}{base}:{tag}", path=path, source=source, where=str(path), size=st.st_size,
                       modified=st.st_mtime, aliases=tuple(sorted(aliases)))


def scan_files(files: list[Path], source: str, namespace_of=lambda p: "") \
        -> tuple[list[StoredModel], list[StoreProblem]]:
    models, problems = [], []
    for path in files:
        model = stored_file(path, source, namespace_of(path))
        problem = check_gguf(path)
        if problem is None:
            models.append(model)
        else:
            problems.append(StoreProblem(model.name, problem))
    return models, problems


def scan(root: Path) -> tuple[list[StoredModel], list[StoreProblem]]:
    return scan_files(gguf_files(root), "folder")
