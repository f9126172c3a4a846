"""Which experts an MoE model's routers select, token by token: a diagnostic for synthetic routing
(hypura/synth/routing.py) and a reference trace for expert-cache counters.

Installed as the context's cb_eval, it observes only the `ffn_moe_topk-<layer>` nodes (llama.cpp's
build_moe_ffn): each observation makes the scheduler synchronize once per layer, fine for a trace,
not for serving. The ids are read with ggml_backend_tensor_get, never through the data pointer.
`ffn_moe_topk` is a view of the first k columns of an [n_expert, n_tokens] argsort, so its bytes
span n_expert ids per token, of which the first k are the selected ones.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from hypura.bindings.ffi import ffi, lib

TOPK_NODE = "ffn_moe_topk-"


class RoutingTrace:
    def __init__(self, n_expert: int, n_used: int):
        import llama_cpp

        self.n_expert, self.k = n_expert, n_used
        self.calls: dict[int, list[np.ndarray]] = defaultdict(list)  # layer -> [n_tokens, k] per graph
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._eval)  # keep alive with the context

    def _eval(self, tensor, ask: bool, _user_data) -> bool:
        t = ffi.cast("struct ggml_tensor *", tensor)
        name = ffi.string(lib().ggml_get_name(t)).decode()
        if not name.startswith(TOPK_NODE):
            return False
        if ask:
            return True
        n = lib().ggml_nbytes(t) // 4
        ids = np.zeros(n + self.n_expert - self.k, np.int32)  # the last token's row ends after its k ids
        lib().ggml_backend_tensor_get(t, ffi.from_buffer(ids), 0, 4 * n)
        self.calls[int(name[len(TOPK_NODE):])].append(ids.reshape(-1, self.n_expert)[:, : self.k].copy())
        return True

    def context_params(self) -> dict:
        """For hypura.Llama(param_overrides={"context_params": ...})."""
        return {"cb_eval": self.callback, "cb_eval_user_data": None}

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
