"""What the server says about a model, read from its GGUF header: its Ollama name, and the `details`
and `model_info` that Ollama's /api/tags, /api/show and /api/ps report.

Names follow Ollama's `name:tag`: the name is the file's stem without its quantization suffix, the tag
the quantization (general.file_type), both lower case, e.g. SmolLM2-135M-Instruct.Q4_1.gguf ->
`smollm2-135m-instruct:q4_1`. A stem with nothing left falls back to general.basename / general.name.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import gguf

from hypura.chat_template import METADATA_KEY

_NOT_NAME = re.compile(r"[^a-z0-9._-]+")
# quantization names as files spell them (Q4_K_M, q4km, IQ2_XXS, F16, BF16, MXFP4...), at the end of a stem
_QUANT_SUFFIX = re.compile(r"[-._](?:i?q\d[a-z0-9_]*|[bf]f?(?:16|32)|f16|f32|mxfp4[a-z0-9_]*|tq\d_\d)$", re.I)


@dataclass(frozen=True)
class ModelInfo:
    name: str  # "name:tag"
    family: str  # general.architecture
    parameter_size: str  # "135M", "7.6B"
    quantization_level: str  # "Q4_1", "Q4_K_M", "" when the file does not say
    size: int  # file bytes
    digest: str  # sha256 of the GGUF header (metadata and tensor table): content-derived, read in milliseconds
    metadata: dict  # scalar GGUF metadata (no arrays)

    def details(self) -> dict:
        return {"parent_model": "", "format": "gguf", "family": self.family, "families": [self.family],
                "parameter_size": self.parameter_size, "quantization_level": self.quantization_level}

    def model_info(self) -> dict:
        """/api/show's model_info: the GGUF's scalar metadata (the template is the response's own field)."""
        return {k: v for k, v in self.metadata.items() if k != METADATA_KEY}


def quantization_level(metadata: dict) -> str:
    file_type = metadata.get("general.file_type")
    try:
        name = gguf.LlamaFileType(int(file_type)).name
    except (TypeError, ValueError):
        return ""
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def parameter_size(n_params: int) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n_params >= scale:
            value = n_params / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n_params)


def slug(text: str) -> str:
    return _NOT_NAME.sub("-", text.lower()).strip("-._")


def ollama_name(path: Path, metadata: dict) -> str:
    stem = path.name.removesuffix(".gguf")
    quant = quantization_level(metadata)
    base = slug(_QUANT_SUFFIX.sub("", stem))
    base = base or slug(str(metadata.get("general.basename") or metadata.get("general.name") or "")) or "model"
    tag = slug(quant) if quant else "latest"
    return f"{base}:{tag}"


def header_digest(path: Path, header_bytes: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(header_bytes))
    return h.hexdigest()


def model_info(path: Path, header, name: Optional[str] = None) -> ModelInfo:
    """From a hypura.modelfile.ModelHeader (hypura.Llama's `header`)."""
    metadata = dict(header.metadata)
    n_params = metadata.get("general.parameter_count") or sum(math.prod(t.shape) for t in header.tensors)
    return ModelInfo(name=name or ollama_name(path, metadata), family=str(header.arch),
                     parameter_size=parameter_size(int(n_params)), quantization_level=quantization_level(metadata),
                     size=path.stat().st_size, digest=header_digest(path, header.data_offset), metadata=metadata)
