"""Changes to llama.cpp's `llama_model_params` and `llama_context_params`, with one precedence.

1. What the plan needs (layers on the GPU, KV cache placement, op offload off beside hook-filled host
   weights, plain buffers for paged or cached experts: the decision's `needed`, plan/load_params.py) and
   what the runtime needs (the load mode of the file's residency, the eval callback of the compute hooks).
2. What the caller gave in `param_overrides` stands; where it contradicts (1), HypuraError. A value
   equal to llama.cpp's own default is no choice (the CLI passes every flag) and yields to (1).
3. The decision's other fields (plan/load_params.py), which read the caller's already: set over (2), under (1).
"""

from __future__ import annotations

import llama_cpp

from hypura.errors import HypuraError

STRUCTS = ("model_params", "context_params")
_DEFAULTS = {"model_params": llama_cpp.llama_model_default_params,
             "context_params": llama_cpp.llama_context_default_params}


class LlamaParams:
    def __init__(self, given: dict | None):
        unknown = set(given or {}) - set(STRUCTS)
        if unknown:
            raise HypuraError(f"param_overrides takes {' and '.join(STRUCTS)}, not {', '.join(sorted(unknown))}")
        self.given = {name: dict(fields) for name, fields in (given or {}).items()}  # a copy: never the caller's
        self.needed: dict = {name: {} for name in STRUCTS}
        self.chosen: dict = {name: {} for name in STRUCTS}

    def need(self, struct: str, why: str, **fields) -> None:
        """(1): fields the runtime must have; a contradicting caller value is refused."""
        defaults = _DEFAULTS[struct]()
        for key, value in fields.items():
            given = self.given.get(struct, {}).get(key, value)
            if given != value and given != getattr(defaults, key, object()):
                raise HypuraError(f"param_overrides {struct}.{key}={given!r} contradicts the plan, which needs "
                                  f"{value!r} ({why})")
            self.needed[struct][key] = value

    def decided(self, struct: str, **fields) -> None:
        """(3): the decision's fields that no plan needs (it let the caller's choices stand)."""
        self.chosen[struct].update(fields)

    def merged(self) -> dict:
        """struct -> fields to set over llama-cpp-python's params, in the precedence above."""
        return {name: {**self.given.get(name, {}), **self.chosen[name], **self.needed[name]} for name in STRUCTS}
