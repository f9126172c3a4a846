"""Speculative decoding: drafters (n-gram lookup, a draft model for one sequence or many, a tree of candidates),
verification of a draft or a tree in one pass of the target, and the draft length chosen from what passes cost;
all against a target's context (target.Target). hypura.loaded.drafts loads draft models and makes what the
settings name; hypura.llama_speculative runs them inside hypura.Llama's generate loop.

    settings.py      SpecSettings: llama.cpp's --spec-* flags
    target.py        Target: what speculation needs of a model's context
    ngram.py         NgramSimple, PromptLookup: drafts from the token history
    draft_model.py   DraftModel: a small GGUF drafting for one sequence or for every engine slot
    tree_draft.py    a draft model proposing a tree of candidates
    verify.py        a chain draft verified in one pass of the target
    tree.py          a tree of candidates verified in one pass of the target
    draft_length.py  DraftLength: the draft length or node budget that maximises tok/s, from measured costs
    vocab_match.py   whether a draft's vocabulary is the target's, token by token
    loop.py          speculation inside a loop that hands out one token at a time (hypura-cli's)
    generate.py      greedy generation with or without speculation, for benchmarks and tests
    auto_draft.py    speculation unasked: a draft found in the stores, n-gram drafting where a pass is nearly free
"""

from hypura.speculative.draft_length import DraftLength
from hypura.speculative.ngram import NgramSimple, PromptLookup
from hypura.speculative.settings import SPEC_TYPES, SpecSettings
from hypura.speculative.target import Target
from hypura.speculative.tree import DraftTree
from hypura.speculative.verify import SpecStats, Verifier

__all__ = ["DraftLength", "DraftTree", "NgramSimple", "PromptLookup", "SPEC_TYPES", "SpecSettings", "SpecStats",
           "Target", "Verifier"]
