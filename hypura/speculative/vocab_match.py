"""Whether a draft model can draft for a target: the same vocabulary, token by token.

As llama.cpp's common_speculative_are_compatible: the same vocabulary type, the same BOS/EOS when
they are added, sizes within 128 tokens, and the same text for every token both have from id 5 on
(the first few are often control tokens a fine-tune renamed). One rule set (`mismatch`) over two
views of a vocabulary: a loaded model's (llama_vocab, what the draft's load checks) and a GGUF
header's (modelfile's FileVocab, what the search for a draft checks without loading weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import llama_cpp

from hypura.errors import HypuraError

MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_FROM_TOKEN = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


@dataclass(frozen=True)
class VocabView:
    kind: object  # the tokenizer type
    add_bos: bool
    bos: Optional[int]
    add_eos: bool
    eos: Optional[int]
    n_tokens: int
    text: Callable[[int], bytes]


def loaded(vocab) -> VocabView:
    """A llama_vocab pointer's view."""
    v = llama_cpp
    return VocabView(v.llama_vocab_type(vocab), bool(v.llama_vocab_get_add_bos(vocab)), v.llama_vocab_bos(vocab),
                     bool(v.llama_vocab_get_add_eos(vocab)), v.llama_vocab_eos(vocab), v.llama_vocab_n_tokens(vocab),
                     lambda i: v.llama_vocab_get_text(vocab, i))


def from_file(fv) -> VocabView:
    """A GGUF header's view (hypura.modelfile.read_vocab)."""
    return VocabView(fv.kind, fv.add_bos, fv.bos, fv.add_eos, fv.eos, len(fv.tokens), fv.tokens.__getitem__)


def mismatch(target: VocabView, draft: VocabView) -> str | None:
    """Why the draft's vocabulary cannot stand for the target's; None if it can."""
    if target.kind != draft.kind:
        return "another tokenizer type"
    for name, add_t, add_d, tok_t, tok_d in (("BOS", target.add_bos, draft.add_bos, target.bos, draft.bos),
                                             ("EOS", target.add_eos, draft.add_eos, target.eos, draft.eos)):
        if add_t != add_d or (add_t and tok_t != tok_d):
            return f"another {name} token"
    n_t, n_d = target.n_tokens, draft.n_tokens
    if abs(n_t - n_d) > MAX_SIZE_DIFFERENCE:
        return f"{n_d} tokens, the target {n_t}"
    for i in range(CHECK_FROM_TOKEN, min(n_t, n_d)):
        a, b = target.text(i), draft.text(i)
        if a != b:
            return f"token {i} is {b.decode('utf-8', 'replace')!r}, the target's {a.decode('utf-8', 'replace')!r}"
    return None


def vocab_mismatch(target_vocab, draft_vocab) -> str | None:
    """Why the draft's vocabulary (a llama_vocab pointer) cannot stand for the target's; None if it can."""
    return mismatch(loaded(target_vocab), loaded(draft_vocab))


def check_compatible(target_vocab, draft_vocab, draft_path) -> None:
    """Raise HypuraError (one line) when the draft's vocabulary is not the target's."""
    why = vocab_mismatch(target_vocab, draft_vocab)
    if why is not None:
        raise HypuraError(f"draft model {draft_path} does not share the target's vocabulary ({why})")
