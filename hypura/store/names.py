"""Ollama's model names, as its `types/model` package parses them: [registry/][namespace/]name[:tag],
compared case-insensitively, with registry.ollama.ai, library and latest filled in; shown shortest
(`qwen3:30b-a3b`, `someone/model:q4`, `host:5000/ns/model:tag`). Files outside Ollama's store get a name
in the same shape: the file's stem less its quantization suffix, tagged with the quantization."""

from __future__ import annotations

import re
from typing import NamedTuple

DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

_NOT_NAME = re.compile(r"[^a-z0-9._-]+")
# quantization names as files spell them (Q4_K_M, q4km, IQ2_XXS, F16, BF16, MXFP4...), at the end of a stem
_QUANT_SUFFIX = re.compile(r"[-._](i?q\d[a-z0-9_]*|[bf]f?(?:16|32)|f16|f32|mxfp4[a-z0-9_]*|tq\d_\d)$", re.I)


class Name(NamedTuple):
    registry: str
    namespace: str
    model: str
    tag: str

    def short(self) -> str:
        """Ollama's DisplayShortest: the defaults left out."""
        prefix = "" if self.registry == DEFAULT_REGISTRY else f"{self.registry}/{self.namespace}/"
        if not prefix and self.namespace != DEFAULT_NAMESPACE:
            prefix = f"{self.namespace}/"
        return f"{prefix}{self.model}:{self.tag}"


def parse(text: str) -> Name:
    """An Ollama name with its defaults filled in (no validation beyond the shape: lookups decide)."""
    text = text.strip().lower()
    head, _, last = text.rpartition("/")
    model, colon, tag = last.partition(":")
    parts = head.split("/") if head else []
    registry = parts[-2] if len(parts) >= 2 else DEFAULT_REGISTRY
    namespace = parts[-1] if parts else DEFAULT_NAMESPACE
    return Name(registry, namespace, model, tag if colon and tag else DEFAULT_TAG)


def slug(text: str) -> str:
    return _NOT_NAME.sub("-", text.lower()).strip("-._")


def file_name(stem: str) -> tuple[str, str]:
    """(name, tag) for a GGUF file's stem: `SmolLM2-135M-Instruct.Q4_1` -> (smollm2-135m-instruct, q4_1)."""
    m = _QUANT_SUFFIX.search(stem)
    base = slug(stem[:m.start()] if m else stem) or slug(stem) or "model"
    return base, slug(m.group(1)) if m else DEFAULT_TAG
