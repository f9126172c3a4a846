"""Ollama's store ($OLLAMA_MODELS, default ~/.ollama/models), read-only.

manifests/<registry>/<namespace>/<model>/<tag> is a JSON manifest (Docker's v2 schema): `layers` of
{mediaType, digest "sha256:<hex>", size}; the layer of media type application/vnd.ollama.image.model is
the GGUF, stored as blobs/sha256-<hex>; application/vnd.ollama.image.params holds the Modelfile's
PARAMETERs as JSON (stop, temperature, num_ctx...). /api/tags' digest is the manifest file's sha256.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from hypura.store.stored import StoredModel, StoreProblem, check_gguf
from hypura.store.names import Name

MODEL_LAYER = "application/vnd.ollama.image.model"
PARAMS_LAYER = "application/vnd.ollama.image.params"
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


def blob_path(root: Path, digest: str) -> Path:
    m = _DIGEST.fullmatch(str(digest))
    if m is None:
        raise ValueError(f"layer digest {str(digest)[:80]!r} is not sha256:<64 hex digits>")
    return root / "blobs" / f"sha256-{m.group(1)}"


def scan(root: Path) -> tuple[list[StoredModel], list[StoreProblem]]:
    manifests = root / "manifests"
    if not manifests.is_dir():
        return [], []
    models, problems = [], []
    for path in sorted(p for p in manifests.glob("*/*/*/*") if p.is_file()):
        registry, namespace, model, tag = path.relative_to(manifests).parts
        name = Name(registry.lower(), namespace.lower(), model.lower(), tag.lower()).short()
        try:
            models.append(read_manifest(root, path, name))
        except ValueError as e:
            problems.append(StoreProblem(name, f"{path}: {e}"))
    return models, problems


def read_manifest(root: Path, path: Path, name: str) -> StoredModel:
    """The model a manifest names; ValueError with one line when it or its blobs are unusable."""
    raw = path.read_bytes()
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not a JSON manifest ({e})") from None
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
        raise ValueError("not an Ollama manifest (no list of layers)")
    by_type = {layer.get("mediaType"): layer for layer in layers}
    if MODEL_LAYER not in by_type:
        raise ValueError(f"no model layer ({MODEL_LAYER}): not a GGUF model")
    gguf = blob_path(root, by_type[MODEL_LAYER].get("digest"))
    problem = check_gguf(gguf)
    if problem is not None:
        raise ValueError(f"model layer {problem}")
    params = {}
    if PARAMS_LAYER in by_type:
        try:
            params = json.loads(blob_path(root, by_type[PARAMS_LAYER].get("digest")).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"params layer unreadable ({e})") from None
        if not isinstance(params, dict):
            raise ValueError("params layer is not a JSON object")
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    size = sum(int(layer.get("size") or 0) for layer in layers) + int(config.get("size") or 0)
    return StoredModel(name=name, path=gguf, source="ollama", where=str(path), size=size or gguf.stat().st_size,
                       modified=path.stat().st_mtime, digest=hashlib.sha256(raw).hexdigest(), params=params)
