"""The draft length (a chain) or node budget (a tree) that maximises expected tokens per second.

Online, per generation, three things are measured:
- the verification pass's cost by the tokens it carries (the last sampled token plus the draft or the
  tree's nodes): a running mean per count timed, a least-squares line between counts never timed; counts
  measured elsewhere (`hypura bench -p 1,2,4,...`) may seed it;
- acceptance by position: for a drafted token at depth d that was its parent's r-th candidate by draft
  probability (r = 1 in a chain), how often the target's own token was it, once its parent was reached
  (decayed counts; while a cell has few recent trials it leans on the rate one level up, so deep
  positions, rarely reached once acceptance falls, fall with it);
- drafting time per level (one draft-model decode, or one n-gram lookup).

With those, a node at depth d is accepted with the product of its path's rates, and a pass yields
1 + the sum of its nodes' products; the best tree of n nodes holds the n largest products (a child's
product never exceeds its parent's, so they form a tree), found best-first. A chain is the tree of
width 1. The next n maximises (1 + E(n)) / (pass(n + 1) + levels(n) * draft_s); the first two passes
carry the largest and the smallest n so that the cost line has two points.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Optional

DECAY = 0.9  # per pass: acceptance follows the last ~10 passes (0.95 kept stale deep rates for ~40 passes)
PRIOR_TRIALS = 2.0  # a (depth, rank) cell's weight on the rate one level up (depth 1: its rank's pooled rate)
PRIOR_RATE = 0.5  # the top candidate's acceptance before any pass (Beta(1, 1)); the r-th's is this / r^2


@dataclass
class PassTimes:
    """Mean seconds of a pass by the tokens it carries."""

    by_tokens: dict[int, list[float]] = field(default_factory=dict)  # n -> [count, seconds]

    @classmethod
    def given(cls, seconds_by_tokens: dict[int, float]) -> "PassTimes":
        """Seeded with pass costs measured elsewhere (`hypura bench -p`); runs add to them."""
        t = cls()
        for n, s in seconds_by_tokens.items():
            t.add(int(n), float(s))
        return t

    @classmethod
    def starting(cls, given_ms=None, plan=None) -> "PassTimes":
        """What a run starts from: pass costs measured beforehand ({tokens: ms}, --spec-pass-ms), else the plan's
        predicted step times up to 64 tokens (each step size at its own path through the plan: step_paths)."""
        if given_ms:
            return cls.given({n: ms / 1e3 for n, ms in dict(given_ms).items()})
        steps = getattr(plan, "step_paths", ())
        return cls.given({k: k / rate for k, _, rate in steps if rate > 0 and k <= 64})

    def add(self, n_tokens: int, seconds: float) -> None:
        c = self.by_tokens.setdefault(n_tokens, [0, 0.0])
        c[0] += 1
        c[1] += seconds

    def mean(self, n_tokens: int) -> float:
        c = self.by_tokens[n_tokens]
        return c[1] / c[0]

    def predict(self, n_tokens: int) -> float:
        if n_tokens in self.by_tokens:
            return self.mean(n_tokens)
        seen = sorted(self.by_tokens)
        if not seen:
            return 1.0
        if len(seen) == 1:
            return self.mean(seen[0])
        xs, ys = seen, [self.mean(n) for n in seen]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return max(my + max(slope, 0.0) * (n_tokens - mx), 1e-9)


@dataclass
class Acceptance:
    """Decayed hits and trials by (depth, rank), both from 1."""

    hits: dict[tuple[int, int], float] = field(default_factory=dict)
    trials: dict[tuple[int, int], float] = field(default_factory=dict)

    def decay(self) -> None:
        for table in (self.hits, self.trials):
            for key in table:
                table[key] *= DECAY

    def observe(self, depth: int, rank: int, hit: bool) -> None:
        key = (depth, rank)
        self.trials[key] = self.trials.get(key, 0.0) + 1.0
        self.hits[key] = self.hits.get(key, 0.0) + (1.0 if hit else 0.0)

    def pooled(self, rank: int) -> float:
        h = sum(v for (_, r), v in self.hits.items() if r == rank)
        t = sum(v for (_, r), v in self.trials.items() if r == rank)
        return (h + PRIOR_RATE / rank ** 2) / (t + 1.0)

    def _shrunk(self, depth: int, rank: int, prior: float) -> float:
        key = (depth, rank)
        return (self.hits.get(key, 0.0) + PRIOR_TRIALS * prior) / (self.trials.get(key, 0.0) + PRIOR_TRIALS)

    def rates(self, depth_max: int, width: int) -> dict[tuple[int, int], float]:
        out = {}
        for r in range(1, width + 1):
            prior = self.pooled(r)
            for d in range(1, depth_max + 1):
                out[(d, r)] = prior = self._shrunk(d, r, prior)
        return out

    def rate(self, depth: int, rank: int = 1) -> float:
        return self.rates(depth, rank)[(depth, rank)]

    def expected(self, n_max: int, width: int, depth_max: int) -> tuple[list[float], list[int]]:
        """E[n]: expected accepted drafted tokens of the best n-node tree (children per node <= width,
        depth <= depth_max), and levels[n]: its depth; for n = 0..n_max."""
        rates = self.rates(depth_max, width)
        e, levels = [0.0], [0]
        heap = [(-rates[(1, r)], 1) for r in range(1, width + 1)] if depth_max > 0 else []
        heapq.heapify(heap)
        while heap and len(e) <= n_max:
            p, d = heapq.heappop(heap)
            e.append(e[-1] - p)
            levels.append(max(levels[-1], d))
            if d < depth_max:
                for r in range(1, width + 1):
                    heapq.heappush(heap, (p * rates[(d + 1, r)], d + 1))
        return e, levels


@dataclass
class DraftLength:
    """n_max: the longest draft (chain) or the most nodes (tree); width: candidates per node (1: a chain);
    depth_max: a tree's deepest node (a chain: n_max)."""

    n_max: int
    n_min: int = 0
    width: int = 1
    depth_max: Optional[int] = None
    times: PassTimes = field(default_factory=PassTimes)
    accept: Acceptance = field(default_factory=Acceptance)
    draft_s: float = 0.0  # seconds per drafting level (running mean)
    n_levels: int = 0

    @property
    def acceptance(self) -> float:
        """The top candidate's acceptance at depth 1."""
        return self.accept.rate(1, 1)

    def _curve(self, hi: int, depth_cap: int) -> tuple[list[float], list[int]]:
        depth = min(self.depth_max or self.n_max, depth_cap)
        return self.accept.expected(hi, self.width, depth)

    def expected_tokens(self, n: int, depth_cap: int = 1 << 30) -> float:
        e, _ = self._curve(n, depth_cap)
        return 1.0 + e[min(n, len(e) - 1)]

    def rate(self, n: int, depth_cap: int = 1 << 30) -> float:
        """Predicted tokens per second with n drafted tokens (nodes)."""
        e, levels = self._curve(n, depth_cap)
        n = min(n, len(e) - 1)
        return (1.0 + e[n]) / (self.times.predict(n + 1) + levels[n] * self.draft_s)

    def choose(self, limit: int) -> int:
        """The draft length (node budget) to ask for next; a chain's is at most `limit` (tokens left,
        context left), a tree's depth is."""
        hi = max(0, self.n_max if self.width > 1 else min(self.n_max, limit))
        if limit <= 0:
            return 0
        lo = min(max(self.n_min, 1), hi)  # at least one drafted token, so acceptance stays measured
        seen = self.times.by_tokens
        if len(seen) < 2 and hi > 0:  # two pass sizes timed first: the cost line needs two points
            return lo if hi + 1 in seen else hi
        e, levels = self._curve(hi, limit)
        hi = min(hi, len(e) - 1)
        return max(range(lo, hi + 1), default=0,
                   key=lambda n: (1.0 + e[n]) / (self.times.predict(n + 1) + levels[n] * self.draft_s))

    def record(self, n_drafted: int, n_accepted: int, pass_s: float, draft_s: float,
               outcomes: Optional[Iterable[tuple[int, int, bool]]] = None, levels: Optional[int] = None) -> None:
        """A pass carried n_drafted tokens (nodes) and n_accepted of them were kept. outcomes: (depth, rank,
        accepted) of every candidate whose parent was reached (a chain's follow from the counts); levels:
        drafting levels (a chain: n_drafted)."""
        self.times.add(n_drafted + 1, pass_s)
        if not n_drafted:
            return
        if outcomes is None:
            outcomes = [(d, 1, True) for d in range(1, n_accepted + 1)]
            if n_accepted < n_drafted:
                outcomes.append((n_accepted + 1, 1, False))
        self.accept.decay()
        for depth, rank, hit in outcomes:
            self.accept.observe(depth, rank, hit)
        levels = n_drafted if levels is None else levels
        if levels:
            self.n_levels += levels
            self.draft_s += (draft_s / levels - self.draft_s) * levels / self.n_levels


def chain_rate(pass_seconds, draft_token_s: float, agreement: float, n_max: int) -> tuple[float, int]:
    """The best predicted tokens per second of chains of up to n_max drafted tokens, and its length, before any
    pass is measured: each drafted token accepted with `agreement` once its parent was (a pass of k drafted
    tokens yields 1 + a + ... + a^k), a pass of n tokens costing pass_seconds(n), drafting draft_token_s a token.
    The same sum as DraftLength.rate's, with one rate for every depth."""
    best, length, expected = 0.0, 0, 1.0
    for k in range(n_max + 1):
        if k:
            expected += agreement ** k
        rate = expected / (pass_seconds(k + 1) + k * draft_token_s)
        if rate > best:
            best, length = rate, k
    return best, length

