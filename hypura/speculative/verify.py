"""Verification in one pass: the last sampled token and a draft, evaluated in one llama_decode.

The target computes logits at every position of the batch; the caller's sampler then samples
position 0, 1, ... and the draft's token i is accepted while the target's own sample at position i
equals it (llama.cpp's rule: greedy output is the target's, sampled output keeps the target's
distribution since every emitted token is one the target sampled from its own logits). The first
mismatch (or an end-of-generation token) ends the pass: its sample is emitted as the correction,
and the KV cells of the rejected draft tokens are removed. A pass thus emits 1 to len(draft) + 1
tokens, and the last one emitted is not yet in the KV cache: it leads the next pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from hypura.bindings.batch import Batch
from hypura.speculative.draft_length import DraftLength
from hypura.speculative.target import Target


@dataclass
class SpecStats:
    passes: int = 0
    emitted: int = 0  # tokens the passes yielded (accepted drafts plus each pass's own)
    drafted: int = 0
    accepted: int = 0
    pass_s: float = 0.0
    draft_s: float = 0.0
    by_tokens: dict[int, list[float]] = field(default_factory=dict)  # tokens carried -> [passes, seconds]
    chosen: list[list[int]] = field(default_factory=list)  # drafted tokens (nodes) pass after pass: [n, passes] runs

    def add(self, n_draft: int, n_accepted: int, pass_s: float, draft_s: float) -> None:
        self.passes += 1
        self.emitted += n_accepted + 1
        self.drafted += n_draft
        self.accepted += n_accepted
        self.pass_s += pass_s
        self.draft_s += draft_s
        c = self.by_tokens.setdefault(n_draft + 1, [0, 0.0])
        c[0] += 1
        c[1] += pass_s
        if self.chosen and self.chosen[-1][0] == n_draft:
            self.chosen[-1][1] += 1
        else:
            self.chosen.append([n_draft, 1])

    def summary(self) -> dict:
        p = max(self.passes, 1)
        return {
            "passes": self.passes, "tokens_per_pass": self.emitted / p, "accepted_per_pass": self.accepted / p,
            "drafted_per_pass": self.drafted / p,
            "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            "pass_ms": 1e3 * self.pass_s / p, "draft_ms": 1e3 * self.draft_s / p,
            "tok_s": self.emitted / (self.pass_s + self.draft_s) if self.pass_s else 0.0,
            "pass_ms_by_tokens": {n: 1e3 * s / c for n, (c, s) in sorted(self.by_tokens.items())},
        }

    def describe(self) -> list[str]:
        s = self.summary()
        by = ", ".join(f"{n}: {ms:.1f} ms x{int(self.by_tokens[n][0])}" for n, ms in s["pass_ms_by_tokens"].items())
        return [
            f"speculative: {s['passes']} passes, {s['tokens_per_pass']:.2f} tokens per pass "
            f"({s['accepted_per_pass']:.2f} drafted tokens accepted, acceptance {s['acceptance']:.2f}), "
            f"{s['tok_s']:.2f} tok/s",
            f"speculative: pass {s['pass_ms']:.1f} ms, drafting {s['draft_ms']:.2f} ms per pass",
            f"speculative: pass time by tokens carried: {by or 'n/a'}",
            "speculative: drafted tokens a pass over time: "
            + (" ".join(f"{n}x{k}" for n, k in self.chosen[-40:]) or "n/a")
            + (" (last 40 runs)" if len(self.chosen) > 40 else ""),
        ]


def accept(draft: Sequence[int], sample: Callable[[int], int], is_eog: Callable[[int], bool]) -> list[int]:
    """The tokens a pass of [last token, *draft] emits: the target's sample at position 0, 1, ... while it
    equals the draft's token there (and is no end of generation), the first mismatch included."""
    out: list[int] = []
    for i in range(len(draft) + 1):
        tok = sample(i)
        out.append(tok)
        if i == len(draft) or tok != draft[i] or is_eog(tok):
            break
    return out


def keep_accepted(target: Target, seq: int, n_past: int, draft: Sequence[int], sample: Callable[[int], int],
                  is_eog: Callable[[int], bool]) -> list[int]:
    """After one decode of `seq`'s [last token, *draft] at n_past: the tokens the pass emits (accept), and the
    rejected drafts' KV cells removed (all but the last emitted token stay in the cache). Every chain pass ends
    here: one sequence's (Verifier) and each sequence's of an engine step."""
    out = accept(draft, sample, is_eog)
    target.seq_rm(seq, n_past + len(out), -1)
    return out


class Verifier:
    """Drafts, verifies in one pass, trims the KV cache; one sequence (seq 0) of a target (hypura-cli's loop,
    bench's greedy runs)."""

    def __init__(self, target: Target, drafter, length: DraftLength, is_eog: Callable[[int], bool]):
        self.target, self.drafter, self.length, self.is_eog = target, drafter, length, is_eog
        self.stats = SpecStats()
        self._batch = Batch(length.n_max + 1)

    def step(self, history: Sequence[int], n_past: int, sample: Callable[[int], int], limit: int) -> Optional[list[int]]:
        """history: the tokens in the KV cache (n_past of them) then the last sampled token, which
        this pass decodes at position n_past. sample(i): the target's token from the batch's i-th
        logits, accepted into the sampler. limit: the most tokens this pass may emit. Returns the
        emitted tokens (all but the last now in the KV cache), or None when llama_decode failed."""
        k = self.length.choose(limit - 1)
        t0 = time.perf_counter()
        draft = list(self.drafter.draft(history, k))[:k] if k > 0 else []
        t1 = time.perf_counter()
        b = self._batch
        for i, tok in enumerate([history[-1]] + draft):
            b.set(i, tok, n_past + i, (0,), True)
        b.c.n_tokens = len(draft) + 1
        if self.target.decode(b, True) != 0:
            return None
        t2 = time.perf_counter()
        out = keep_accepted(self.target, 0, n_past, draft, sample, self.is_eog)
        self.length.record(len(draft), len(out) - 1, t2 - t1, t1 - t0)
        self.stats.add(len(draft), len(out) - 1, t2 - t1, t1 - t0)
        return out

    def close(self) -> None:
        self._batch.close()
        close = getattr(self.drafter, "close", None)
        if close is not None:
            close()
