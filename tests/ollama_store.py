"""A fake Ollama store, written as Ollama writes one: blobs/sha256-<hex of the content> and a manifest per
name at manifests/<registry>/<namespace>/<model>/<tag> (Docker's v2 schema: a config layer, the GGUF as
application/vnd.ollama.image.model, a params layer of JSON)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path


@functools.lru_cache(maxsize=None)
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _blob(root: Path, data: bytes = None, source: Path = None) -> dict:
    hexdigest = hashlib.sha256(data).hexdigest() if data is not None else _sha256(source)
    blob = root / "blobs" / f"sha256-{hexdigest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        if data is not None:
            blob.write_bytes(data)
        else:
            try:
                os.link(source, blob)  # the same bytes, without copying (a 70B is 40 GB)
            except OSError:
                blob.symlink_to(Path(source).resolve())  # another filesystem: read through a link
    return {"digest": f"sha256:{hexdigest}", "size": blob.stat().st_size}


def add_model(root: Path, name: str, gguf: Path, params: dict = None, registry="registry.ollama.ai") -> Path:
    """Write `gguf` into the store as `name` ([namespace/]model[:tag]); the manifest's path."""
    head, _, last = name.rpartition("/")
    model, _, tag = last.partition(":")
    namespace = head or "library"
    config = json.dumps({"model_format": "gguf", "model_family": "llama", "file_type": "Q4_1",
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    layers = [{"mediaType": "application/vnd.ollama.image.model", **_blob(root, source=gguf)}]
    if params is not None:
        layers.append({"mediaType": "application/vnd.ollama.image.params",
                       **_blob(root, data=json.dumps(params).encode())})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **_blob(root, data=config)},
                "layers": layers}
    path = root / "manifests" / registry / namespace / model / (tag or "latest")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def write_manifest(root: Path, name: str, text: str) -> Path:
    """A manifest with any content (broken ones)."""
    head, _, last = name.rpartition("/")
    model, _, tag = last.partition(":")
    path = root / "manifests" / "registry.ollama.ai" / (head or "library") / model / (tag or "latest")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fake_store(root: Path, smollm2: Path, gemma: Path) -> Path:
    """SmolLM2 as `smol` (with params) and `someone/smol:tiny`; Gemma as `gemma3:270m`; and three broken
    entries: a manifest that is not JSON, one whose blob is missing, one whose blob is not a GGUF."""
    add_model(root, "smol", smollm2, params={"stop": ["<|im_end|>", "User:"], "temperature": 0.25, "num_ctx": 256})
    add_model(root, "someone/smol:tiny", smollm2)
    add_model(root, "gemma3:270m", gemma)
    write_manifest(root, "broken:json", "{not json")
    missing = {"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "0" * 64,
                           "size": 1}]}
    write_manifest(root, "broken:missing", json.dumps(missing))
    text = root / "notgguf.txt"
    text.write_text("this is not a model\n")
    layer = {"mediaType": "application/vnd.ollama.image.model", **_blob(root, source=text)}
    write_manifest(root, "broken:notgguf", json.dumps({"layers": [layer]}))
    return root
