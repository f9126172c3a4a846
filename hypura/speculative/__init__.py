"""Speculative decoding: drafters (n-gram lookup, a draft model), verification of a draft in one
pass of the target, and the draft length chosen from what passes cost."""

from hypura.speculative.cost import DraftLength
from hypura.speculative.llama_tree import DraftTree
from hypura.speculative.ngram import NgramSimple, PromptLookup
from hypura.speculative.settings import SPEC_TYPES, SpecSettings, make_drafter, make_verifier
from hypura.speculative.verify import SpecStats, Verifier

__all__ = ["DraftLength", "DraftTree", "NgramSimple", "PromptLookup", "SPEC_TYPES", "SpecSettings", "SpecStats",
           "Verifier",
           "make_drafter", "make_verifier"]
