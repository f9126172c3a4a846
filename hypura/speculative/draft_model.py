"""A draft model: a small GGUF with the target's vocabulary, resident beside the target.

It keeps its own KV cache of the history it has seen; each call keeps the prefix the history still
shares with it (rejected drafts are removed), decodes the rest, then drafts greedily one token at a
time, stopping early where its top token's probability falls below p_min (llama.cpp's draft-simple).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import llama_cpp
import numpy as np

from hypura.speculative.vocab import check_compatible


class DraftModel:
    name = "draft"

    def __init__(self, llm, p_min: float = 0.0):
        """llm: the draft model, loaded (a hypura.Llama). Its KV cache is this drafter's alone."""
        self.llm, self.p_min = llm, p_min
        self.cached: list[int] = []  # the tokens in the draft's KV cache, in order
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llm._model.vocab)
        self.n_batch = llama_cpp.llama_n_batch(llm.ctx)

    @classmethod
    def load(cls, path, target, p_min: float = 0.0, **kwargs) -> "DraftModel":
        """Load `path` beside `target` (load_beside) with the target's context size."""
        kwargs.setdefault("n_ctx", llama_cpp.llama_n_ctx(target.ctx))
        return cls(load_beside(path, target, **kwargs), p_min)

    def _sync(self, history: Sequence[int]) -> None:
        """The draft's cache holds `history`, its last token's logits ready."""
        keep = kept_prefix(self.cached, history)
        mem = llama_cpp.llama_get_memory(self.llm.ctx)
        llama_cpp.llama_memory_seq_rm(mem, 0, keep, -1)
        self.cached = list(history[:keep])
        rest = list(history[keep:])
        for i in range(0, len(rest), self.n_batch):
            chunk = rest[i: i + self.n_batch]
            if not self.llm.decode_tokens(chunk):
                raise RuntimeError("the draft model's llama_decode failed")
            self.cached += chunk

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        if n_max <= 0 or not history:
            return []
        self._sync(history)
        out: list[int] = []
        while True:
            tok, p = top_token(self.llm.ctx, -1, self.n_vocab, self.p_min)
            if p < self.p_min:
                break
            out.append(tok)
            if len(out) >= n_max:
                break
            if not self.llm.decode_tokens([tok]):
                break
            self.cached.append(tok)
        return out

    def close(self) -> None:
        self.llm.close()


def kept_prefix(cached: Sequence[int], history: Sequence[int]) -> int:
    """How much of a draft's KV (`cached`) serves `history`: the prefix they share, less history's last token,
    which is decoded again (its logits are needed)."""
    return min(llama_cpp.Llama.longest_token_prefix(cached, history), len(history) - 1)


def top_token(ctx, i: int, n_vocab: int, p_min: float) -> tuple[int, float]:
    """The draft's greedy token at output i and its probability (1.0 when no p_min asks for it)."""
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
    tok = int(np.argmax(logits))
    return tok, 1.0 if p_min <= 0.0 else float(1.0 / np.exp(logits - logits[tok]).sum())


def draft_path(draft_model) -> Optional[str]:
    """The GGUF a `Llama(draft_model=...)` loads beside the target: a path's, a DraftTree's; None for drafters
    without a model file (n-gram, prompt lookup) or one loaded already."""
    if isinstance(draft_model, (str, os.PathLike)):
        return os.fspath(draft_model)
    if hasattr(draft_model, "context_params"):  # a DraftTree
        return os.fspath(draft_model.model)
    return None


def load_beside(path, target, **kwargs):
    """A draft GGUF as a hypura.Llama resident beside `target`, `kwargs` over that: where the target's decision
    reserved its memory (Decision.beside_on_gpu: every layer on the GPU, or the CPU), else every layer where
    llama.cpp's --fit places it in what is free now. Refused (one line) when its vocabulary is not the target's."""
    from hypura.llama import Llama

    reserved = getattr(getattr(target, "decision", None), "beside_on_gpu", None)
    kwargs.setdefault("n_gpu_layers", 0 if reserved is False else -1)
    if reserved is not None:
        kwargs.setdefault("fit", False)  # placed as reserved: fitting it again would read the target's memory as taken
    kwargs.setdefault("verbose", False)
    llm = Llama(str(path), **kwargs)
    try:
        check_compatible(target._model.vocab, llm._model.vocab, Path(path).name)
    except Exception:
        llm.close()
        raise
    return llm
