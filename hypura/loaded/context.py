"""One llama_context of a loaded model and its KV cache (llama.cpp's memory): the only place Hypura calls
llama_memory_seq_* and llama_memory_clear. Every decode goes through the Runtime (timed, checked for a streaming
failure); llama-cpp-python's eval decodes through `RuntimeContext` to the same end."""

from __future__ import annotations

import time
from typing import Optional

import llama_cpp
import llama_cpp._internals as internals
import numpy as np

from hypura.bindings.batch import Batch


class RuntimeContext(internals.LlamaContext):
    """llama-cpp-python's context owner, whose decode (its eval's and embed's) is Runtime.decode: timed, and a
    streaming failure raises right after it."""

    def __init__(self, *, runtime, **kwargs):
        super().__init__(**kwargs)
        self.runtime = runtime
        self.last_decode_seconds = 0.0

    def decode(self, batch: internals.LlamaBatch) -> None:
        t0 = time.perf_counter()
        rc = self.runtime.decode(self.ctx, Batch.view(batch.batch))
        self.last_decode_seconds = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")


class Context:
    """A context's decodes, outputs and KV cache by sequence. Positions are llama.cpp's: p0 inclusive, p1
    exclusive, -1 for "from the start" / "to the end"."""

    def __init__(self, owner: RuntimeContext, n_vocab: int):
        self.owner = owner  # llama-cpp-python's object, closed by the LoadedModel
        self.ctx = owner.ctx  # llama_context *
        self.runtime = owner.runtime
        self.n_vocab = n_vocab
        self._mem = llama_cpp.llama_get_memory(self.ctx)

    # --- sizes ----------------------------------------------------------------------------------
    def n_ctx(self) -> int:
        return llama_cpp.llama_n_ctx(self.ctx)

    # what llama.cpp's getters of the same names read
    n_batch = property(lambda self: llama_cpp.llama_n_batch(self.ctx))
    n_ubatch = property(lambda self: llama_cpp.llama_n_ubatch(self.ctx))
    n_seq_max = property(lambda self: llama_cpp.llama_n_seq_max(self.ctx))
    n_ctx_seq = property(lambda self: llama_cpp.llama_n_ctx_seq(self.ctx))
    n_threads = property(lambda self: llama_cpp.llama_n_threads(self.ctx))
    n_threads_batch = property(lambda self: llama_cpp.llama_n_threads_batch(self.ctx))

    # --- decoding -------------------------------------------------------------------------------
    def decode(self, batch: Batch, decode: Optional[bool] = None) -> int:
        """llama_decode a prepared batch through the runtime, timed for stats() as decode (`decode`; unset: one
        token is decode) or prefill. llama_decode's status (0 ok, 1 no KV slot, < 0 error); raises when weights
        could not be streamed."""
        return self.runtime.decode(self.ctx, batch, decode)

    def decode_tokens(self, tokens: list[int], decode: Optional[bool] = None) -> bool:
        """`tokens` of sequence 0 after those in its cache, logits for the last; False when llama_decode fails."""
        return self.decode(Batch.of(tokens), decode) == 0

    @property
    def last_decode_seconds(self) -> float:
        """The last decode of llama-cpp-python's eval (its verification pass's cost, for drafting)."""
        return self.owner.last_decode_seconds

    def logits(self, i: int) -> np.ndarray:
        """The last decode's logits at output i (negative: from the end), a view into llama.cpp's buffer."""
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    def output_rows(self, n: int) -> np.ndarray:
        """The last decode's first n output rows (all its logits), writable: [n, n_vocab]."""
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.ctx), shape=(n, self.n_vocab))

    # --- the KV cache ---------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove `seq`'s cells in [p0, p1) (seq -1: every sequence's); False where the memory keeps whole
        sequences only (a recurrent model's)."""
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """`dst` also holds `src`'s cells in [p0, p1) (in a unified cache: the same cells, no copy)."""
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        """Every sequence but `seq` removed."""
        llama_cpp.llama_memory_seq_keep(self._mem, seq)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Shift `seq`'s positions in [p0, p1) by delta (a context shift)."""
        llama_cpp.llama_memory_seq_add(self._mem, seq, p0, p1, delta)

    def pos_min(self, seq: int) -> int:
        """`seq`'s smallest position in the cache, -1 when it holds none."""
        return llama_cpp.llama_memory_seq_pos_min(self._mem, seq)

    def pos_max(self, seq: int) -> int:
        """`seq`'s largest position in the cache, -1 when it holds none."""
        return llama_cpp.llama_memory_seq_pos_max(self._mem, seq)

    def can_shift(self) -> bool:
        """Whether positions can be shifted (seq_add): llama-completion's context shift."""
        return bool(llama_cpp.llama_memory_can_shift(self._mem))

    def clear(self) -> None:
        """Every sequence's cells and data gone: the next decode starts at position 0."""
        llama_cpp.llama_memory_clear(self._mem, True)
