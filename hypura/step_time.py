"""Two formulas of the cost model (plan/cost.py) that the profile (profile/compute.py) needs too, to say how far a
measured step is from what the cost model would sum: below both, so neither imports the other's floor."""

from __future__ import annotations


def step_probability(p: float, parallel: int) -> float:
    """Probability that a step of `parallel` tokens reads a unit each token reads with probability p."""
    return 1.0 if p >= 1.0 else 1.0 - (1.0 - p) ** parallel


def batch_compute_s(nbytes: float, flops: float, read_rate: float | None, flop_rate: float | None,
                    parallel: int) -> float:
    """A device's seconds for a step: its weight bytes at the one-token decode rate (that token's compute
    included), then the FLOPs of the step's other tokens at its matmul rate."""
    return seconds_at(nbytes, read_rate) + seconds_at(flops * (parallel - 1) / parallel, flop_rate)


def seconds_at(num: float, rate: float | None) -> float:
    """Seconds to move or compute `num` at `rate`: 0 for nothing, inf without a rate."""
    if num <= 0:
        return 0.0
    return num / rate if rate else float("inf")
