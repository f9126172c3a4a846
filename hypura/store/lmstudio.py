"""LM Studio's models folder, ~/.lmstudio/models/<publisher>/<repo>/*.gguf: each file is named
`<publisher>/<stem less quantization>:<quantization>`, and answers to the name without the publisher
while no other model claims it. Multimodal projectors (mmproj-*.gguf) are not models to run."""

from __future__ import annotations

from pathlib import Path

from hypura.store.stored import StoredModel, StoreProblem
from hypura.store.folder import gguf_files, scan_files
from hypura.store.names import slug


def scan(root: Path) -> tuple[list[StoredModel], list[StoreProblem]]:
    files = [p for p in gguf_files(root) if len(p.relative_to(root).parts) == 3 and not p.name.startswith("mmproj")]
    return scan_files(files, "lmstudio", lambda p: slug(p.relative_to(root).parts[0]))
