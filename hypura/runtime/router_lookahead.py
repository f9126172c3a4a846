"""Layer l+1's experts guessed at layer l's router hook: l+1's router applied to l's router input.

Why: the residual stream changes little from one layer to the next, so the next layer's router scores
this layer's hidden state much as it will score its own. Unlike recorded co-activation counts
(coactivation.py), this needs no earlier runs and sees the token itself.

How: the hook gets layer l's selected ids, a view of `ffn_moe_argsort-l`; that node's sources lead to the
router input: argsort <- `ffn_moe_probs-l` (softmax) <- `ffn_moe_logits-l` (router matmul), whose second
source is the normed hidden state, kept alive for the expert matmuls still to run. It is read with
ggml_backend_tensor_get, never through a device pointer. Routers whose selection differs (biased or grouped
selection, another gating) do not match that chain, and are not guessed; nor are routers not stored as
F32 or F16. Everything runs on the thread of llama_decode, inside the hook: `seen` keeps the hook's tensor
for `likely_next` in that same call only.
"""

from __future__ import annotations

import warnings
from typing import Optional

import numpy as np

from hypura.bindings.ffi import ffi, lib
from hypura.runtime.coactivation import next_moe_layer

_CHAIN = ("ffn_moe_argsort-", "ffn_moe_probs-", "ffn_moe_logits-")  # from the selected ids' view to the router
_GGML_OBJECT_SIZE = 32  # ggml.c's struct ggml_object, which ggml_tensor_overhead() adds to a tensor's size
GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1  # enum ggml_type (ggml.h)
_DTYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}


def layout_matches_library() -> bool:
    """Our cdef of struct ggml_tensor has the library's size (fields walked here must lie where ggml puts them)."""
    return lib().ggml_tensor_overhead() - _GGML_OBJECT_SIZE == ffi.sizeof("struct ggml_tensor")


def router_input(selected, layer: int) -> Optional[np.ndarray]:
    """[n_tokens, n_embd] float32: the input of the router whose top-k `selected` views; None where the graph
    does not hold the chain above."""
    node = selected.view_src
    for prefix in _CHAIN:
        if node == ffi.NULL or ffi.string(node.name).decode(errors="replace") != f"{prefix}{layer}":
            return None
        node = node.src[0] if prefix != _CHAIN[-1] else node.src[1]
    if node == ffi.NULL or node.type != GGML_TYPE_F32 or node.nb[1] != 4 * node.ne[0]:
        return None
    x = np.empty((node.ne[1], node.ne[0]), np.float32)
    lib().ggml_backend_tensor_get(node, ffi.from_buffer(x), 0, x.nbytes)
    return x


class RouterLookahead:
    """likely_next(layer, experts) for the pager's prefetch, from the router input `seen` in the same hook."""

    def __init__(self, model, layers: tuple[int, ...], n_embd: int, k: int):
        """model: struct llama_model *; layers: the MoE layers in graph order."""
        self.model, self.n_embd, self.k = model, n_embd, k
        self.next_layer = next_moe_layer(layers)
        self._routers: dict[int, Optional[np.ndarray]] = {}  # layer -> [n_expert, n_embd], read at first use
        self._seen = (-1, None)
        self.enabled = True
        if not layout_matches_library():
            self._turn_off("this llama.cpp's struct ggml_tensor is not the one Hypura reads")

    def seen(self, layer: int, selected) -> None:
        """The router hook's selected-ids tensor of `layer`: valid until the hook returns."""
        self._seen = (layer, selected)

    def likely_next(self, layer: int, experts: list[int]) -> tuple[int, list[int]]:
        """The next MoE layer (-1: none) and its k experts with the highest scores for this token, best first."""
        nxt = self.next_layer.get(layer, -1)
        seen_layer, selected = self._seen
        self._seen = (-1, None)
        if nxt < 0 or not self.enabled or seen_layer != layer:
            return -1, []
        x = router_input(selected, layer)
        scores = self.scores(nxt, x) if x is not None and x.shape == (1, self.n_embd) else None
        if scores is None:  # a graph or router this does not read: no guesses for the rest of the run
            self._turn_off(f"layer {layer}'s router is not a plain top-k of an F32/F16 router matmul")
            return -1, []
        scores = scores[0]
        top = np.argpartition(-scores, self.k - 1)[:self.k]
        return nxt, [int(e) for e in top[np.argsort(-scores[top])]]

    def _turn_off(self, why: str) -> None:
        self.enabled = False
        warnings.warn(f"hypura: HYPURA_DISK_PREFETCH=router is off for this model: {why}", stacklevel=3)

    def scores(self, layer: int, x: np.ndarray) -> Optional[np.ndarray]:
        """Layer's router scores (before softmax) of hidden states x [n_tokens, n_embd]."""
        router = self._router(layer)
        return None if router is None else x @ router.T

    def _router(self, layer: int) -> Optional[np.ndarray]:
        if layer not in self._routers:
            self._routers[layer] = _read_router(self.model, layer, self.n_embd)
        return self._routers[layer]


def _read_router(model, layer: int, n_embd: int) -> Optional[np.ndarray]:
    t = lib().hypura_model_tensor(model, f"blk.{layer}.ffn_gate_inp.weight".encode())
    dtype = _DTYPES.get(t.type) if t != ffi.NULL else None
    if dtype is None or t.ne[0] != n_embd or t.ne[2] != 1:
        return None
    w = np.empty((t.ne[1], n_embd), dtype)
    lib().ggml_backend_tensor_get(t, ffi.from_buffer(w), 0, w.nbytes)
    return w.astype(np.float32)
