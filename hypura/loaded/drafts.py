"""Draft models loaded beside a target, and the drafters and verifiers speculation settings name: the one place
speculation loads a model (hypura.speculative drafts and verifies against what is loaded here)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from hypura.errors import HypuraError
from hypura.plan.ask import Ask
from hypura.loaded.load import load
from hypura.loaded.model import LoadedModel
from hypura.speculative.draft_length import DraftLength, PassTimes
from hypura.speculative.draft_model import DraftModel
from hypura.speculative.ngram import NgramSimple, PromptLookup
from hypura.speculative.settings import SpecSettings
from hypura.speculative.tree import TreeVerifier, context_params
from hypura.speculative.tree_draft import TreeDrafter
from hypura.speculative.verify import Verifier
from hypura.speculative.vocab_match import check_compatible


def draft_path(draft_model) -> Optional[str]:
    """The GGUF a `Llama(draft_model=...)` loads beside the target: a path's, a DraftTree's; None for drafters
    without a model file (n-gram, prompt lookup) or one loaded already."""
    if isinstance(draft_model, (str, os.PathLike)):
        return os.fspath(draft_model)
    if hasattr(draft_model, "context_params"):  # a DraftTree
        return os.fspath(draft_model.model)
    return None


def load_beside(path, target, **kwargs) -> LoadedModel:
    """A draft GGUF resident beside `target` (a LoadedModel or a hypura.Llama), Ask.of's `kwargs` over that:
    where the target's decision reserved its memory (Decision.beside_on_gpu: every layer on the GPU, or the CPU),
    else every layer where llama.cpp's --fit places it in what is free now. Refused (one line) when its vocabulary
    is not the target's."""
    reserved = getattr(getattr(target, "decision", None), "beside_on_gpu", None)
    kwargs.setdefault("n_gpu_layers", 0 if reserved is False else -1)
    if reserved is not None:
        kwargs.setdefault("fit", False)  # placed as reserved: fitting it again would read the target's memory as taken
    kwargs.setdefault("verbose", False)
    draft = load(str(path), Ask.of(**kwargs))
    try:
        check_compatible(target.vocab.vocab, draft.vocab.vocab, Path(path).name)
    except Exception:
        draft.close()
        raise
    return draft


def draft_model(path, target, n_seq: int = 1, p_min: float = 0.0, **kwargs) -> DraftModel:
    """A DraftModel of `path` beside `target` with a KV sequence for each of n_seq target sequences (the target's
    context per sequence each; n_ctx in kwargs: the whole cache)."""
    kwargs.setdefault("n_ctx", target.n_ctx())
    if n_seq > 1:
        kwargs.setdefault("parallel", n_seq)  # one unified KV cache of n_seq sequences (hypura.plan.load_params)
    draft = load_beside(path, target, **kwargs)
    return DraftModel(draft.context, n_seq, p_min, model=draft)


def make_drafter(s: SpecSettings, target, **draft_kwargs):
    """The drafter `s` names, for `target` (a loaded model); type auto resolved first
    (speculative.auto_draft.resolve)."""
    if s.type == "auto":
        raise HypuraError("speculative decoding of type auto is resolved against its loaded target first")
    if s.type == "draft-simple":
        return draft_model(s.draft_model, target, p_min=s.p_min, **draft_kwargs)
    if s.type == "ngram-simple":
        return NgramSimple(s.ngram_size_n, s.ngram_size_m)
    return PromptLookup(num_pred_tokens=s.n_max)


def tree_drafter(path, target, branches: int, p_split: float, **draft_kwargs) -> TreeDrafter:
    """A draft model building trees of `branches` leaves: a sequence per branch in its own cache."""
    overrides = draft_kwargs.pop("param_overrides", {})
    overrides.setdefault("context_params", {}).update(context_params(branches))
    return TreeDrafter(draft_model(path, target, param_overrides=overrides, parallel=branches, **draft_kwargs),
                       branches, p_split)


def make_verifier(s: SpecSettings, target: LoadedModel, is_eog, **draft_kwargs):
    """One sequence's verification loop (hypura-cli's, bench's) with the drafter `s` names."""
    times = PassTimes.starting(s.pass_ms, target.plan)
    if s.tree:
        drafter = tree_drafter(s.draft_model, target, s.tree, s.p_split, **draft_kwargs)
        return TreeVerifier(target.context, drafter, DraftLength(s.tree * s.n_max, s.n_min, s.tree, s.n_max, times),
                            is_eog)
    return Verifier(target.context, make_drafter(s, target, **draft_kwargs), DraftLength(s.n_max, s.n_min, times=times),
                    is_eog)
