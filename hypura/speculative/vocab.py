"""Whether a draft model can draft for a target: the same vocabulary, token by token.

As llama.cpp's common_speculative_are_compatible: the same vocabulary type, the same BOS/EOS when
they are added, sizes within 128 tokens, and the same text for every token both have from id 5 on
(the first few are often control tokens a fine-tune renamed).
"""

from __future__ import annotations

import llama_cpp

from hypura.errors import HypuraError

MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_FROM_TOKEN = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


def vocab_mismatch(target_vocab, draft_vocab) -> str | None:
    """Why the draft's vocabulary (a llama_vocab pointer) cannot stand for the target's; None if it can."""
    v = llama_cpp
    if v.llama_vocab_type(target_vocab) != v.llama_vocab_type(draft_vocab):
        return "another tokenizer type"
    for name, add, tok in (("BOS", v.llama_vocab_get_add_bos, v.llama_vocab_bos),
                           ("EOS", v.llama_vocab_get_add_eos, v.llama_vocab_eos)):
        if add(target_vocab) != add(draft_vocab) or (add(target_vocab) and tok(target_vocab) != tok(draft_vocab)):
            return f"another {name} token"
    n_t, n_d = v.llama_vocab_n_tokens(target_vocab), v.llama_vocab_n_tokens(draft_vocab)
    if abs(n_t - n_d) > MAX_SIZE_DIFFERENCE:
        return f"{n_d} tokens, the target {n_t}"
    for i in range(CHECK_FROM_TOKEN, min(n_t, n_d)):
        a, b = v.llama_vocab_get_text(target_vocab, i), v.llama_vocab_get_text(draft_vocab, i)
        if a != b:
            return f"token {i} is {b.decode('utf-8', 'replace')!r}, the target's {a.decode('utf-8', 'replace')!r}"
    return None


def check_compatible(target_vocab, draft_vocab, draft_path) -> None:
    """Raise HypuraError (one line) when the draft's vocabulary is not the target's."""
    why = vocab_mismatch(target_vocab, draft_vocab)
    if why is not None:
        raise HypuraError(f"draft model {draft_path} does not share the target's vocabulary ({why})")
