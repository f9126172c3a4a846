"""Which experts an MoE model's routers select, token by token: a diagnostic for synthetic routing
(hypura/synth/routing.py) and a reference trace for expert-cache counters. `RoutingTrace.record` is an
`on_route` callback for hypura.Llama, called once per MoE layer and graph."""

from collections import defaultdict

import numpy as np


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
