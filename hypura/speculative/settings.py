"""Speculative decoding's settings (llama.cpp's --spec-* flags); hypura.loaded.drafts makes what they name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hypura.errors import HypuraError

# the --spec-type names Hypura implements: llama.cpp's (common/speculative.cpp), llama-cpp-python's prompt lookup
# decoding, and auto (speculative/auto_draft.py: a draft found in the stores with -md auto, else ngram-simple where the
# plan makes it pay, else none; what hypura-cli and hypura serve do unless told: `--spec-type none` turns it off)
SPEC_TYPES = ("draft-simple", "ngram-simple", "prompt-lookup", "auto")


@dataclass(frozen=True)
class SpecSettings:
    type: str = "draft-simple"  # draft-simple needs draft_model
    draft_model: Optional[Path] = None  # auto: an AutoDraft (speculative/auto_draft.py) searches the stores for one
    n_max: int = 16  # llama.cpp's default is 3; the cost model picks the length up to this
    n_min: int = 0
    p_min: float = 0.0  # a draft model stops drafting below this probability
    ngram_size_n: int = 12  # ngram-simple's lookup length (llama.cpp's default)
    ngram_size_m: int = 48  # ngram-simple's longest draft
    tree: int = 0  # > 1: a draft model's tree of up to this many branches, n_max deep (hypura.speculative.tree)
    p_split: float = 0.1  # a tree's lower candidates branch off above this draft probability (llama.cpp's)
    pass_ms: tuple = ()  # ((tokens carried, ms), ...) measured beforehand (`hypura bench -p 1,2,4,...`)

    @property
    def beside(self) -> Optional[Path]:
        """The draft GGUF loaded beside the target (draft-simple's), whose memory the target's plan keeps."""
        return self.draft_model if self.type in ("draft-simple", "auto") else None

    @property
    def pass_rows(self) -> int:
        """The most tokens a verification pass carries, each an output: the longest draft (a tree's every node,
        as make_verifier's DraftLength) and the token it follows."""
        return self.n_max * max(1, self.tree) + 1

    def __post_init__(self):
        from hypura.speculative.auto_draft import is_auto

        if self.type not in SPEC_TYPES:
            raise HypuraError(f"unknown speculative decoding type {self.type!r} (one of {', '.join(SPEC_TYPES)})")
        if self.type == "draft-simple" and (self.draft_model is None or is_auto(self.draft_model)):
            raise HypuraError("--spec-type draft-simple needs a draft model (-md FNAME)")
        if self.type == "auto" and self.draft_model is not None and not is_auto(self.draft_model):
            raise HypuraError("--spec-type auto takes no draft model but -md auto (a draft found in the stores)")
        if self.n_max < 1 or self.n_min < 0 or self.n_min > self.n_max:
            raise HypuraError(f"draft lengths must satisfy 0 <= n_min <= n_max, n_max >= 1 "
                              f"(n_min {self.n_min}, n_max {self.n_max})")
        if self.tree and (self.beside is None or not 1 < self.tree <= 64):
            raise HypuraError("--spec-tree N takes a draft model (-md FNAME) and 2 <= N <= 64 branches")
