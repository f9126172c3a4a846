"""Changes to llama.cpp's `llama_model_params` and `llama_context_params`, with one precedence.

1. What the runtime needs for the plan it runs (layers on the GPU, KV cache placement, op offload off
   beside hook-filled host weights, direct I/O for a disk tier, plain buffers for paged or cached
   experts, the eval callback of the compute hooks) is set by the runtime.
2. What the caller gave in `param_overrides` stands; where it contradicts (1), HypuraError. A value
   equal to llama.cpp's own default is no choice (the CLI passes every flag) and yields to (1).
3. Hypura's preferences (e.g. expert caches read the file instead of mapping it) yield to (1) and (2).
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
        self.preferred: dict = {name: {} for name in STRUCTS}

    def need(self, struct: str, why: str, **fields) -> None:
        """(1): fields the runtime must have; a contradicting caller value is refused."""
        defaults = _DEFAULTS[struct]()
        for key, value in fields.items():
            given = self.given.get(struct, {}).get(key, value)
            if given != value and given != getattr(defaults, key, object()):
                raise HypuraError(f"param_overrides {struct}.{key}={given!r} contradicts the plan, which needs "
                                  f"{value!r} ({why})")
            self.needed[struct][key] = value

    def prefer(self, struct: str, **fields) -> None:
        """(3): Hypura's choice where neither the runtime needs a value nor the caller gave one."""
        self.preferred[struct].update(fields)

    def merged(self) -> dict:
        """struct -> fields to set over llama-cpp-python's params, in the precedence above."""
        return {name: {**self.preferred[name], **self.given.get(name, {}), **self.needed[name]} for name in STRUCTS}
