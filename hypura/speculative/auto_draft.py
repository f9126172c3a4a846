"""Speculation without asking: a draft found in the stores, and n-gram drafting where a pass is nearly free.

- A draft found for the user (`hypura.Llama(draft_model="auto")`, `hypura-cli -md auto`, `hypura serve` by
  default): where the target's plan streams weights, the stores Hypura reads (hypura.store: --models-dir or
  $HYPURA_MODELS, Ollama's, LM Studio's) are searched for models whose vocabulary is the target's by llama.cpp's
  rules (speculative/vocab_match.py, read from GGUF headers: no weights loaded) and whose weights are at most MAX_SHARE
  of the target's. The largest MAX_TRIED are each planned beside the target (plan/beside.py: on the GPU or in
  RAM, whichever makes the faster pass) and the one the cost model predicts the most tokens per second for is
  kept, where that beats the target's plan without a draft by MIN_GAIN. One line says which, where, and the
  predicted gain; no candidate, or none paying, says nothing.
- N-gram drafting by default (`ngram_pays`): llama.cpp's ngram-simple drafts from the history, no second model,
  so a draft costs only the tokens a pass carries; where the plan streams weights and a pass carrying
  DRAFT_TOKENS_PLANNED more tokens costs at most FLAT more than a pass of one, it is on. Its length then follows
  the cost model (draft_length.py) as any drafter's does; where a pass costs its tokens it stays off.
- `resolve`: SpecSettings(type="auto") made concrete once the target is loaded.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from hypura.errors import HypuraError, ModelFileError
from hypura.plan import knobs

AUTO = "auto"  # what -md, draft_model= and draft_beside= take for "find one"
MAX_SHARE = 0.25  # a draft of more than a quarter of the target's bytes reads too much a drafted token to pay
MAX_TRIED = 3  # candidates planned beside the target (a plan each), the largest first
# the acceptance the prediction assumes before any pass: same-family drafts (Llama 3.2 1B for 3.x 70B, Qwen 0.5B
# for 14B) accept 0.6-0.8 of their tokens in llama.cpp's and SpecBench's reports; the low end
AGREEMENT = 0.6
MIN_GAIN = 1.1  # a predicted gain below 10 % is within what the prediction gets wrong: no draft
FLAT = 1.25  # n-gram drafting pays where a pass of 1 + DRAFT_TOKENS_PLANNED tokens costs at most 25 % more than one


@dataclass(frozen=True)
class AutoDraft:
    """A draft to be found (the `"auto"` of draft_model / draft_beside): where to search besides Ollama's and
    LM Studio's stores (models_dir: --models-dir; None: $HYPURA_MODELS)."""

    models_dir: Optional[Path] = None


def is_auto(draft) -> bool:
    return isinstance(draft, AutoDraft) or (isinstance(draft, (str, os.PathLike)) and os.fspath(draft) == AUTO)


@dataclass(frozen=True)
class FoundDraft:
    name: str  # the store's name for it
    path: Path
    decision: object  # the target's hypura.plan.decision.Decision with the draft kept beside
    gain: float  # predicted tokens per second over the target's plan without a draft
    length: int  # drafted tokens a pass the prediction assumed

    def line(self) -> str:
        where = "on the GPU" if self.decision.beside_on_gpu else "in RAM"
        return (f"hypura: draft {self.name} ({self.path}) {where} beside the target: predicted {self.gain:.2f}x "
                f"tok/s ({self.length} drafted tokens a pass at agreement {AGREEMENT})")


def streams(plan) -> bool:
    """The plan reads weights over a link or from disk every pass (a resident model's has no such pass)."""
    return plan is not None and plan.mode != "full-resident"


def ngram_pays(plan) -> bool:
    if not streams(plan):
        return False
    return plan.step_seconds(1 + knobs.DRAFT_TOKENS_PLANNED) <= FLAT * plan.step_seconds(1)


def predicted_gain(plain_plan, plan, beside, on_gpu: bool, agreement: float = AGREEMENT,
                   n_max: int = 16) -> tuple[float, int]:
    """(tokens per second with the draft beside, over plain decoding with the plan made without it; the drafted
    tokens a pass that rate takes)."""
    from hypura.speculative.draft_length import chain_rate

    rate, k = chain_rate(plan.step_seconds, beside.token_seconds(plan, on_gpu), agreement, n_max)
    return rate * plain_plan.step_seconds(1), k


def candidates(target_path, models: Iterable, max_share: Optional[float] = None) -> list:
    """The stored models (hypura.store.StoredModel) whose vocabulary is the target's and whose weights are at most
    max_share of its own, largest first; files that cannot be read are passed over."""
    from hypura.modelfile import read_header, read_vocab
    from hypura.modelfile.problems import Problem
    from hypura.speculative.vocab_match import from_file, mismatch

    target = read_header(target_path)
    limit = (MAX_SHARE if max_share is None else max_share) * target.weight_bytes
    want = from_file(read_vocab(target.path))
    found, seen = [], {Path(target.path).resolve()}
    for m in models:
        path = Path(m.path).resolve()
        if path in seen or (m.size and m.size > 2 * limit):  # a store's size counts more than weights: a margin
            continue
        seen.add(path)
        try:
            header = read_header(path)
            if header.weight_bytes > limit or mismatch(want, from_file(read_vocab(path))) is not None:
                continue
        except (ModelFileError, Problem, OSError):
            continue
        found.append((header.weight_bytes, m))
    return [m for _, m in sorted(found, key=lambda x: -x[0])]


def find_draft(header, ask, machine, models: Optional[Iterable] = None) -> tuple[object, Optional[FoundDraft]]:
    """(the target's Decision without a draft, the draft to keep beside it or None) for the target `header` loaded
    as `ask` (hypura.plan.decision.Ask); machine: what decide() reads of this machine (loaded/measured.py's
    Measured); models: the stored models to search (None: the stores ask.draft_beside names). The target and each
    candidate beside it are decided here, on the same machine (a candidate that does not fit is passed over)."""
    from hypura.modelfile import read_header
    from hypura.plan.beside import Beside

    plain = _decided(header, ask, machine, None)
    if not streams(plain.plan):
        return plain, None
    if models is None:
        from hypura.store import Catalog

        search = ask.draft_beside if isinstance(ask.draft_beside, AutoDraft) else AutoDraft()
        models = Catalog.scan(search.models_dir)
    best = None
    for m in candidates(header.path, models)[:MAX_TRIED]:
        beside = Beside.of(read_header(m.path), ask.n_ubatch)
        try:
            d = _decided(header, ask, machine, beside)
        except HypuraError:
            continue
        if d.plan is None or d.beside_on_gpu is None:
            continue
        gain, k = predicted_gain(plain.plan, d.plan, beside, d.beside_on_gpu)
        if best is None or gain > best.gain:
            best = FoundDraft(m.name, Path(m.path), d, gain, k)
    return plain, (best if best is not None and best.gain >= MIN_GAIN else None)


def _decided(header, ask, machine, beside):
    """The target's decision with `beside` (a candidate, or None) kept beside it."""
    from hypura.plan.decision import decide

    return decide(header, dataclasses.replace(ask, beside=beside), machine.free, machine.profile, machine.routing,
                  devices=machine.devices)


def resolve(s, llm):
    """SpecSettings for the loaded target `llm`: type "auto" becomes the draft its decision found
    (llm.draft_found), else ngram-simple where the plan makes it pay, else None (no speculation)."""
    if s is None or s.type != AUTO:
        return s
    found = getattr(llm, "draft_found", None)
    if found is not None:
        return dataclasses.replace(s, type="draft-simple", draft_model=found)
    if ngram_pays(getattr(llm, "plan", None)):
        return dataclasses.replace(s, type="ngram-simple", draft_model=None, tree=0)
    return None
