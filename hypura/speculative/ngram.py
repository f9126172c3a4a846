"""Self-drafting from the token history: no second model.

Two kinds, as the tools users know name them:
- `NgramSimple` (llama.cpp's `--spec-type ngram-simple`): the last `size_n` tokens are looked up
  in the history, newest match first; the `size_m` tokens that followed the match are the draft.
- `PromptLookup` (llama-cpp-python's `LlamaPromptLookupDecoding`): n-grams from `max_ngram_size`
  down to 1 are looked up, oldest match first; up to `num_pred_tokens` tokens that followed it.

Both take the history with the last sampled token at its end (the token the next pass decodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


def _find(history: np.ndarray, n: int, newest_first: bool) -> Optional[int]:
    """Start of an earlier occurrence of the history's last `n` tokens, or None."""
    if n < 1 or len(history) <= n:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(history[:-1], n)
    hits = np.nonzero(np.all(windows == history[-n:], axis=1))[0]
    if len(hits) == 0:
        return None
    return int(hits[-1] if newest_first else hits[0])


@dataclass(frozen=True)
class NgramSimple:
    """llama.cpp's ngram-simple; its defaults (common_params_speculative_ngram_map)."""

    size_n: int = 12
    size_m: int = 48
    name = "ngram-simple"

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        h = np.asarray(history, dtype=np.int32)
        start = _find(h, self.size_n, newest_first=True)
        if start is None:
            return []
        follow = h[start + self.size_n: start + self.size_n + min(self.size_m, n_max)]
        return [int(t) for t in follow]


@dataclass(frozen=True)
class PromptLookup:
    """llama-cpp-python's LlamaPromptLookupDecoding (prompt lookup decoding), its defaults."""

    max_ngram_size: int = 2
    num_pred_tokens: int = 10
    name = "prompt-lookup"

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        h = np.asarray(history, dtype=np.int32)
        for n in range(min(self.max_ngram_size, len(h) - 1), 0, -1):
            start = _find(h, n, newest_first=False)
            if start is not None:
                return [int(t) for t in h[start + n: start + n + min(self.num_pred_tokens, n_max)]]
        return []
