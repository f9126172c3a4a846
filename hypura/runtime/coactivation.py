"""Co-activation prediction: which experts fire at layer l+1, given those at layer l.

Counts C[l][i, j] = tokens that selected expert i at layer l and expert j at layer l+1. At layer l,
the experts predicted for l+1 are the top-m of sum over the selected i of C[l][i, :]. Statistics
persist per model, keyed by a hash of the file's header and router weights (what decides routing),
in the user cache directory: the next run starts warm; `reset` forgets them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from hypura.model_file import ModelHeader
from hypura.profile.store import cache_dir

HASH_CHUNK = 1 << 20


def model_key(header: ModelHeader) -> str:
    """Content hash of what decides routing: the header (shapes, metadata) and the router tensors."""
    h = hashlib.sha256()
    with open(header.path, "rb") as f:
        h.update(f.read(min(header.data_offset, 64 << 20)))
        for t in header.tensors:
            if "ffn_gate_inp" in t.name:
                f.seek(t.offset)
                left = t.nbytes
                while left:
                    chunk = f.read(min(left, HASH_CHUNK))
                    if not chunk:
                        break
                    h.update(chunk)
                    left -= len(chunk)
    return h.hexdigest()[:24]


class CoactivationPredictor:
    def __init__(self, n_layer: int, n_expert: int):
        self.counts = np.zeros((max(n_layer - 1, 0), n_expert, n_expert), np.uint32)

    def observe(self, layer: int, experts, next_experts) -> None:
        self.observe_many([(layer, experts, next_experts)])

    def observe_many(self, observations) -> None:
        """Count many (layer, experts at it, experts at the next) at once, each list of one size k."""
        obs = [(layer, a, b) for layer, a, b in observations if 0 <= layer < len(self.counts)]
        if not obs:
            return
        layers = np.array([o[0] for o in obs])[:, None, None]
        a, b = np.array([o[1] for o in obs]), np.array([o[2] for o in obs])
        np.add.at(self.counts, (layers, a[:, :, None], b[:, None, :]), 1)

    def predict(self, layer: int, experts, m: int) -> list[int]:
        """The m experts most often seen at layer+1 after `experts` at `layer` (none learned: none)."""
        if not 0 <= layer < len(self.counts) or m <= 0:
            return []
        scores = self.counts[layer][np.asarray(experts)].sum(axis=0, dtype=np.int64)
        order = np.argsort(-scores, kind="stable")[:m]
        return [int(e) for e in order if scores[e] > 0]

    # --- persistence ---------------------------------------------------------------------------
    @staticmethod
    def path_for(key: str) -> Path:
        return cache_dir() / "coactivation" / f"{key}.npz"

    def save(self, key: str) -> Path:
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez_compressed(tmp, counts=self.counts)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, key: str, n_layer: int, n_expert: int) -> "CoactivationPredictor":
        """Warm start from a saved file of the same model and shape; a fresh one otherwise."""
        p = cls(n_layer, n_expert)
        path = cls.path_for(key)
        if path.exists():
            try:
                counts = np.load(path)["counts"]
            except (OSError, ValueError, KeyError):
                return p  # unreadable: start cold rather than fail a run
            if counts.shape == p.counts.shape:
                p.counts = counts.astype(np.uint32)
        return p

    @classmethod
    def reset(cls, key: str) -> None:
        cls.path_for(key).unlink(missing_ok=True)
