"""The draft length that maximises expected tokens per second, from what the passes cost.

Online, per generation: each verification pass is timed by the tokens it carries (the last sampled
token plus the draft), each drafted token's acceptance is counted, and drafting is timed. With a
per-token acceptance a, a draft of k yields E(k) = 1 + a + ... + a^k tokens a pass, and costs
pass(k + 1) + k * draft_s; the next draft length is the k in [n_min, n_max] maximising the ratio.
The first two passes carry the longest and the shortest draft; after that a pass's cost for a
token count never timed is the least-squares line through the counts timed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.95  # per pass: the acceptance estimate follows the last ~20 passes
PRIOR = (1.0, 1.0)  # Beta(1, 1): acceptance 0.5 before any pass


@dataclass
class PassTimes:
    """Mean seconds of a pass by the tokens it carries."""

    by_tokens: dict[int, list[float]] = field(default_factory=dict)  # n -> [count, seconds]

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
class DraftLength:
    n_max: int
    n_min: int = 0
    times: PassTimes = field(default_factory=PassTimes)
    accepted: float = PRIOR[0]  # decayed counts of drafted tokens accepted / rejected
    rejected: float = PRIOR[1]
    draft_s: float = 0.0  # seconds per drafted token (running mean)
    n_drafted: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def expected_tokens(self, k: int) -> float:
        a = self.acceptance
        return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)

    def rate(self, k: int) -> float:
        """Predicted tokens per second with a draft of k."""
        return self.expected_tokens(k) / (self.times.predict(k + 1) + k * self.draft_s)

    def choose(self, limit: int) -> int:
        """The draft length to ask for next, at most `limit` (tokens left, context left)."""
        hi = max(0, min(self.n_max, limit))
        lo = min(max(self.n_min, 1), hi)  # at least one drafted token, so acceptance stays measured
        seen = self.times.by_tokens
        if len(seen) < 2 and hi > 0:  # two pass sizes timed first: the cost line needs two points
            return lo if hi + 1 in seen else hi
        return max(range(lo, hi + 1), key=self.rate, default=0)

    def record(self, n_drafted: int, n_accepted: int, pass_s: float, draft_s: float) -> None:
        self.times.add(n_drafted + 1, pass_s)
        if n_drafted:
            self.accepted = self.accepted * DECAY + n_accepted
            self.rejected = self.rejected * DECAY + (1 if n_accepted < n_drafted else 0)
            self.n_drafted += n_drafted
            self.draft_s += (draft_s / n_drafted - self.draft_s) * n_drafted / self.n_drafted
