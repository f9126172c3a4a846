"""MoE routers as the compute hooks report them: which layers route, and each router's choice.

`selected_ids` reads a router's choice from llama.cpp's `ffn_moe_topk` tensor with
ggml_backend_tensor_get, never through its data pointer. That tensor is a view of the first k
columns of an [n_expert, n_tokens] argsort, so its bytes span n_expert ids per token, of which the
first k are the selected ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from hypura.bindings.ffi import ffi, lib
from hypura.errors import HypuraError
from hypura.modelfile import ModelHeader


def selected_ids(tensor, n_expert: int, k: int) -> np.ndarray:
    """[n_tokens, k] expert ids held by an ffn_moe_topk view (struct ggml_tensor *)."""
    n = lib().ggml_nbytes(tensor) // 4
    if n == 0:  # a graph of no tokens (seen between the micro-batches of a 2048-token batch): nothing routed
        return np.zeros((0, k), np.int32)
    ids = np.zeros(n + n_expert - k, np.int32)  # the last token's row ends after its k ids
    lib().ggml_backend_tensor_get(tensor, ffi.from_buffer(ids), 0, 4 * n)
    return ids.reshape(-1, n_expert)[:, :k]


def moe_layers(header: ModelHeader) -> tuple[int, ...]:
    """The layers with an MoE router, in graph order: the predictor's layer i is the i-th of them."""
    return tuple(sorted({t.layer for t in header.tensors if t.name.endswith("ffn_gate_inp.weight")}))


@dataclass(frozen=True)
class Router:
    """Report each MoE layer's chosen experts: callback(layer, ids [n_tokens, n_used]), once per layer
    and graph, after the router ran and before the expert matmuls (include/hypura.h, router hook)."""

    callback: Callable[[int, np.ndarray], None]
    n_expert: int
    n_used: int
    layers: tuple[int, ...]

    @classmethod
    def of(cls, header: ModelHeader, callback) -> Router:
        layers = moe_layers(header)
        if not layers:
            raise HypuraError(f"{header.path.name} has no MoE router: on_route and expert caches need an MoE model")
        return cls(callback, int(header.get("expert_count")), int(header.get("expert_used_count")), layers)
