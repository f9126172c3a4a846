"""Speculative decoding in the engine: several sequences' drafts verified in one step.

Before a step, every decoding sequence drafts from its own history (prompt and generated tokens, the next
token last) with hypura.speculative's n-gram drafters, or all of them at once with a draft model (one
llama_decode a round: hypura.speculative.draft_model, which loader.py loads and hands the engine); its draft
length comes from its own DraftLength (the acceptance of its drafts, the step times by the tokens it carried).
The drafts are cut so that the decode part of the step (every next token plus the drafts) fits one micro-batch
(n_ubatch, and the step's budget): a step over streamed weights that spills into a second micro-batch pays a
second weight pass. The scheduler puts each draft after its sequence's next token, logits at every position;
after the step postprocess.py keeps, per sequence, what hypura.speculative.verify.keep_accepted keeps (the
chain pass every front end ends with) and removes the KV cells of the rest.

Speculation steps aside as the batch grows: with several sequences decoding, a step's drafts are kept only where
the cost model predicts more tokens a second with them: every sequence's next token plus the accepted drafts its
DraftLength expects, over the step's cost carrying them (and the drafting rounds), against one token a sequence
over the step's cost without (a step's cost by the tokens its decode part carries: the plan's predicted step
times, then the steps measured). Over streamed weights a step costs about the same whatever it carries and one
client's drafts pay; with many clients the step is already full of tokens and drafts only add to it. A draft
length pinned from below (--spec-draft-n-min > 0) always drafts. Engine thread only.
"""

from __future__ import annotations

import time
import weakref
from typing import Optional

from hypura.engine.metrics import SpecCounters
from hypura.engine.sequence import Sequence
from hypura.errors import HypuraError
from hypura.loaded.drafts import make_drafter
from hypura.speculative.draft_length import DraftLength, PassTimes
from hypura.speculative.draft_model import DraftModel
from hypura.speculative.settings import SpecSettings
from hypura.speculative.verify import keep_accepted


def share(wants: list[int], room: int) -> list[int]:
    """Each want cut to one common cap, the largest whose total fits `room` (short drafts stay whole)."""
    got, left = [0] * len(wants), max(room, 0)
    order = sorted(range(len(wants)), key=wants.__getitem__)
    for j, i in enumerate(order):
        got[i] = min(wants[i], left // (len(order) - j))
        left -= got[i]
    return got


class Speculation:
    def __init__(self, settings: SpecSettings, llm, max_tokens: int, model: Optional[DraftModel] = None):
        """max_tokens: the most tokens the decode part of a step carries (next tokens and drafts); model: the
        draft model of a draft-simple `settings`, loaded with a KV sequence for each of the engine's slots
        (loader.load_draft), closed with this."""
        self.settings, self.max_tokens, self.plan = settings, max_tokens, llm.plan
        self.llm = llm
        self.drafter, self.model = None, None
        if settings.type == "draft-simple":  # all sequences draft together: a KV sequence each in the draft's cache
            if model is None:
                raise HypuraError("a draft-simple engine drafts with a draft model loaded beside its target: "
                                  "hypura.engine.load loads it (engine/loader.py load_draft)")
            self.model = model
        else:
            self.drafter = make_drafter(settings, llm)
        self._lengths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Sequence -> DraftLength
        # a step's cost by the tokens its decode part carries (decode-only steps), seeded as a pass's is
        self.steps = PassTimes.starting(settings.pass_ms, self.plan)
        self.round_s = 0.0  # seconds a drafting round takes (a draft decode of every sequence, or their lookups)
        self._rounds = 0  # drafting rounds of the last drafts (their longest)
        self.aside = False  # the last step's drafts were set aside by the cost model

    def drafts(self, sequences: list[Sequence]) -> tuple[dict[Sequence, list[int]], float]:
        """Each decoding sequence's draft (maybe empty), cut to the step; and the seconds drafting took."""
        t0 = time.perf_counter()
        decoding = [s for s in sequences if s.next_token is not None]
        asks = []
        for s in decoding:
            length = self._lengths.get(s) or self._lengths.setdefault(s, self._length())
            asks.append((s.slot, s.prompt + s.generated, length.choose(s.tokens_left - 1)))  # a pass emits k + 1
        self.aside = len(decoding) > 1 and not self.settings.n_min and not self._pays(decoding, [k for *_, k in asks])
        if self.aside:
            return {}, time.perf_counter() - t0
        if self.model is not None:
            wants = self.model.draft_many(asks)
        else:
            wants = [list(self.drafter.draft(history, k))[:k] if k > 0 else [] for _, history, k in asks]
        cut = share([len(w) for w in wants], self.max_tokens - len(decoding))
        self._rounds = max(cut, default=0)
        return {s: w[:n] for s, w, n in zip(decoding, wants, cut)}, time.perf_counter() - t0

    def _pays(self, decoding: list[Sequence], ks: list[int]) -> bool:
        """Whether drafting ks (each sequence's length) raises the step's predicted tokens per second (above)."""
        n = len(decoding)
        carried = min(n + sum(ks), self.max_tokens)
        expected = n + sum(self._lengths[s].expected_tokens(k) - 1 for s, k in zip(decoding, ks))
        spec = expected / (self.steps.predict(carried) + max(ks, default=0) * self.round_s)
        return spec > n / self.steps.predict(n)

    def record_step(self, tokens: int, step_s: float, draft_s: float) -> None:
        """A decode-only step carried `tokens` (next tokens and drafts) in step_s, after draft_s of drafting."""
        self.steps.add(tokens, step_s)
        if self._rounds and not self.aside:
            self.round_s += (draft_s / self._rounds - self.round_s) * 0.5  # the last few steps' rounds

    def _length(self) -> DraftLength:
        """A new sequence's: its pass times seeded with those measured beforehand (--spec-pass-ms), else the plan's."""
        s = self.settings
        return DraftLength(s.n_max, s.n_min, times=PassTimes.starting(s.pass_ms, self.plan))

    def record(self, seq: Sequence, n_drafted: int, n_accepted: int, step_s: float, draft_s: float) -> None:
        """What a step did with `seq`'s draft, for its next draft length."""
        length = self._lengths.get(seq)
        if length is not None:
            length.record(n_drafted, n_accepted, step_s, draft_s)

    def verify(self, chunk, start: int, picks: dict[int, int], slots, counts: SpecCounters, decode_s: float,
               draft_s: float) -> list[int]:
        """A decoding sequence's next token and draft, decoded at batch index `start`: keep what
        verify.keep_accepted keeps (the tokens before the last emitted one stay in the KV cache, `slots` told),
        remove the rest's KV cells; the tokens sampled, to emit until one ends the sequence."""
        seq, ctx = chunk.seq, self.llm.ctx

        def sample(i: int) -> int:
            token = picks.get(start + i, -1)
            return token if token >= 0 else seq.sampler.sample(ctx, start + i)

        out = keep_accepted(self.llm.context, seq.slot, seq.n_past, chunk.draft, sample, self.llm.vocab.is_eog)
        slots.extend(seq.slot, chunk.tokens[:len(out)])
        seq.n_past += len(out)
        seq.next_token = None
        self.record(seq, len(chunk.draft), len(out) - 1, decode_s, draft_s)
        if chunk.draft:
            counts.passes, counts.drafted = counts.passes + 1, counts.drafted + len(chunk.draft)
            counts.accepted += len(out) - 1
        return out

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
