"""Speculative decoding: drafters (n-gram lookup, a draft model for one sequence or many, a tree of candidates),
verification of a draft or a tree in one pass of the target, and the draft length chosen from what passes cost;
all against a target's context (target.Target). hypura.loaded.drafts loads draft models and makes what the
settings name; hypura.llama_speculative runs them inside hypura.Llama's generate loop.
"""

from hypura.speculative.cost import DraftLength
from hypura.speculative.ngram import NgramSimple, PromptLookup
from hypura.speculative.settings import SPEC_TYPES, SpecSettings
from hypura.speculative.target import Target
from hypura.speculative.tree import DraftTree
from hypura.speculative.verify import SpecStats, Verifier

__all__ = ["DraftLength", "DraftTree", "NgramSimple", "PromptLookup", "SPEC_TYPES", "SpecSettings", "SpecStats",
           "Target", "Verifier"]
