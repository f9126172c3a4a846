"""What speculation needs of a model it drafts with or verifies on (hypura.loaded.Context is one)."""

from __future__ import annotations

from typing import Optional, Protocol

import numpy as np

from hypura.bindings.batch import Batch


class Target(Protocol):
    """A model's context, seen by sequence: evaluate a batch of tokens at given positions and sequences, read the
    logits of the batch's outputs, remove a sequence's cells from a position on (a rejected draft's tail), or let
    one sequence hold another's cells (a tree's branches). Positions are llama.cpp's: p0 inclusive, p1 exclusive,
    -1 for "from the start" / "to the end"."""

    n_vocab: int

    @property
    def n_batch(self) -> int:
        """The most tokens one decode takes."""

    @property
    def n_seq_max(self) -> int:
        """The sequences its KV cache holds."""

    def n_ctx(self) -> int:
        """The KV cache's cells."""

    def decode(self, batch: Batch, decode: Optional[bool] = None) -> int:
        """Evaluate `batch` (tokens with positions, sequence ids, output flags); 0 ok, else llama_decode's status.
        decode: timed as decode (one new token a sequence, or a verification pass) rather than prefill."""

    def logits(self, i: int) -> np.ndarray:
        """The last decode's logits at output i (negative: from the end)."""

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove `seq`'s cells in [p0, p1) (seq -1: every sequence's)."""

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """`dst` also holds `src`'s cells in [p0, p1)."""
