"""`-ot PATTERN=BUFFER_TYPE` (llama.cpp's --override-tensor) as a placement policy.

Same meaning as llama.cpp: the first pattern that `re.search`-matches a tensor name sends it
to that buffer type; "CPU" places it as llama.cpp places CPU overrides (Tier.HOST).
"""

from __future__ import annotations

import re
from typing import Iterable, Union

from hypura.bindings.ffi import ffi, lib
from hypura.errors import HypuraError
from hypura.runtime.placement import Placement, PlacementPolicy, TensorInfo, Tier


def device_buffer_types() -> dict[str, Tier]:
    """Names accepted after '=' (each device's default buffer type, as llama.cpp lists them)."""
    names: dict[str, Tier] = {}
    first_gpu_seen = False
    for i in range(lib().ggml_backend_dev_count()):
        dev = lib().ggml_backend_dev_get(i)
        buft = lib().ggml_backend_dev_buffer_type(dev)
        if buft == ffi.NULL:
            continue
        name = ffi.string(lib().ggml_backend_buft_name(buft)).decode()
        kind = lib().ggml_backend_dev_type(dev)
        if kind == lib().GGML_BACKEND_DEVICE_TYPE_GPU and not first_gpu_seen:
            names[name] = Tier.GPU
            first_gpu_seen = True
        elif kind in (lib().GGML_BACKEND_DEVICE_TYPE_CPU, lib().GGML_BACKEND_DEVICE_TYPE_ACCEL):
            names.setdefault(name, Tier.HOST)
    names["CPU"] = Tier.HOST
    return names


def parse_overrides(spec: Union[str, Iterable[str], None]) -> list[tuple[re.Pattern, Tier]]:
    """Parse "pat=BUFT[,pat=BUFT...]" (or a list of such strings) into (regex, tier) pairs."""
    if spec is None:
        return []
    items = [spec] if isinstance(spec, str) else list(spec)
    known = device_buffer_types()
    rules = []
    for item in items:
        for part in item.split(","):
            pattern, sep, buft = part.partition("=")
            if not sep or not pattern:
                raise HypuraError(f"invalid tensor override '{part}' (expected PATTERN=BUFFER_TYPE)")
            if buft not in known:
                raise HypuraError(
                    f"unknown buffer type '{buft}' in override '{part}' (available: {', '.join(sorted(known))})"
                )
            try:
                rules.append((re.compile(pattern), known[buft]))
            except re.error as e:
                raise HypuraError(f"invalid regex '{pattern}' in tensor override: {e}") from None
    return rules


def overrides_policy(spec: Union[str, Iterable[str], None]) -> PlacementPolicy:
    rules = parse_overrides(spec)

    def policy(info: TensorInfo) -> Placement:
        for pattern, tier in rules:
            if pattern.search(info.name):
                return Placement(tier=tier)
        return Placement()

    return policy
