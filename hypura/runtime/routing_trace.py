"""A router's choice, read from llama.cpp's graph.

`selected_ids` reads a router's choice from llama.cpp's `ffn_moe_topk` tensor with
ggml_backend_tensor_get, never through its data pointer. That tensor is a view of the first k
columns of an [n_expert, n_tokens] argsort, so its bytes span n_expert ids per token, of which the
first k are the selected ones.
"""

from __future__ import annotations

import numpy as np

from hypura.bindings.ffi import ffi, lib


def selected_ids(tensor, n_expert: int, k: int) -> np.ndarray:
    """[n_tokens, k] expert ids held by an ffn_moe_topk view (struct ggml_tensor *)."""
    n = lib().ggml_nbytes(tensor) // 4
    ids = np.zeros(n + n_expert - k, np.int32)  # the last token's row ends after its k ids
    lib().ggml_backend_tensor_get(tensor, ffi.from_buffer(ids), 0, 4 * n)
    return ids.reshape(-1, n_expert)[:, :k]
