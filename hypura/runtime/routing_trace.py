"""Which experts an MoE model's routers select, token by token: a diagnostic for synthetic routing
(hypura/synth/routing.py) and a reference trace for expert-cache counters.

`selected_ids` reads a router's choice from llama.cpp's `ffn_moe_topk` tensor with
ggml_backend_tensor_get, never through its data pointer. That tensor is a view of the first k
columns of an [n_expert, n_tokens] argsort, so its bytes span n_expert ids per token, of which the
first k are the selected ones. `RoutingTrace.record` is an `on_route` callback for hypura.Llama,
which the compute hooks call once per MoE layer and graph (one synchronization per layer).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from hypura.bindings.ffi import ffi, lib


def selected_ids(tensor, n_expert: int, k: int) -> np.ndarray:
    """[n_tokens, k] expert ids held by an ffn_moe_topk view (struct ggml_tensor *)."""
    n = lib().ggml_nbytes(tensor) // 4
    ids = np.zeros(n + n_expert - k, np.int32)  # the last token's row ends after its k ids
    lib().ggml_backend_tensor_get(tensor, ffi.from_buffer(ids), 0, 4 * n)
    return ids.reshape(-1, n_expert)[:, :k]


class RoutingTrace:
    def __init__(self, n_expert: int, n_used: int):
        self.n_expert, self.k = n_expert, n_used
        self.calls: dict[int, list[np.ndarray]] = defaultdict(list)  # layer -> [n_tokens, k] per graph

    def record(self, layer: int, ids: np.ndarray) -> None:
        self.calls[layer].append(np.array(ids, copy=True))

    def selections(self, layer: int) -> np.ndarray:
        """[tokens, k] expert ids chosen at `layer`, over every graph computed so far."""
        return np.concatenate(self.calls[layer]) if self.calls[layer] else np.zeros((0, self.k), np.int32)

    def frequencies(self, layer: int) -> np.ndarray:
        """Share of tokens that selected each expert at `layer` (sums to k)."""
        sel = self.selections(layer)
        return np.bincount(sel.ravel(), minlength=self.n_expert) / max(len(sel), 1)

    def overlap(self, layer: int) -> float:
        """Mean share of a token's experts at `layer` + 1 that it also selected at `layer`."""
        a, b = self.selections(layer), self.selections(layer + 1)
        return float(np.mean([len(set(x) & set(y)) / self.k for x, y in zip(a, b)])) if len(a) else 0.0
