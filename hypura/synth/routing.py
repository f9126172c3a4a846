"""Router weights (`ffn_gate_inp`) shaped for controlled expert popularity and cross-layer correlation.

Why row scales set popularity exactly: router row e scores expert e as w_e . x. With rows of
independent Gaussian entries of std s_e, one token's scores are independent N(0, s_e^2 |x|^2), so
which experts win its top-k depends on the s_e alone, whatever the hidden state x (softmax before
top-k changes nothing: it is monotonic). The scales are calibrated once by Monte Carlo so that
selection frequencies follow Zipf(skew) over the ranks; each layer puts the experts in its own
random rank order. skew 0 is the worst case for caches: every expert equally likely.

Cross-layer correlation: layer l+1's row directions are `corr` x layer l's plus sqrt(1 - corr^2) x
fresh noise. The residual stream changes little from one layer to the next, so expert e at layer
l+1 tends to fire when expert e fired at layer l: a co-activation pattern a predictor can learn
(it is not told that the mapping is the identity). Correlation between consecutive tokens comes
from the text (similar tokens, similar hidden states), not from weights, so it is not a knob.

All of this assumes the router sees token-specific hidden states. In a random-weight model it does
not by default: attention adds an average over the context that dwarfs the token's embedding and is
nearly the same for consecutive tokens, so deeper routers keep picking the same few experts (a
48-layer qwen3-30b-a3b shape: the top 18 of 128 experts take 0.46-0.87 of the selections by layer,
against 0.14 for uniform routing). `out_scale` (--block-out-scale) scales the blocks' output
projections down; at 0.002 every layer's router acts on its token's embedding, and the knobs above
hold at every layer (measured: top 18 take 0.25-0.27 at skew 0, 0.36-0.38 at skew 0.5 against a
target of 0.34, on 96 tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hypura.errors import HypuraError

CALIBRATION_SAMPLES = 20_000  # tokens simulated per calibration step: ~1 % frequency noise
CALIBRATION_STEPS = 40
CALIBRATION_TOLERANCE = 0.05  # largest error in an expert's selection frequency
MAX_FREQUENCY = 0.45  # zero-mean scores: even a huge row wins only when its score is positive (~half the tokens)


@dataclass(frozen=True)
class Routing:
    skew: float = 0.0  # Zipf exponent of expert popularity; 0: uniform
    layer_corr: float = 0.0  # correlation of router directions between consecutive layers
    out_scale: float = 1.0  # std of the blocks' output projections, relative to the other weights

    def __post_init__(self):
        if not 0.0 < self.out_scale <= 1.0:
            raise HypuraError(f"--block-out-scale must be in (0, 1], got {self.out_scale}")
        if not (0.0 <= self.skew <= 4.0 and math.isfinite(self.skew)):
            raise HypuraError(f"--router-skew must be in [0, 4], got {self.skew}")
        if not 0.0 <= self.layer_corr <= 1.0:
            raise HypuraError(f"--router-layer-corr must be in [0, 1], got {self.layer_corr}")

    @property
    def uniform(self) -> bool:
        return self.skew == 0.0 and self.layer_corr == 0.0


def target_frequencies(n_expert: int, k: int, skew: float) -> np.ndarray:
    """Selection probability of the expert of each rank (sums to k), Zipf-shaped, none above
    MAX_FREQUENCY (the excess goes to the others in proportion)."""
    f = k * (1.0 / np.arange(1, n_expert + 1) ** skew)
    f /= f.sum() / k
    for _ in range(n_expert):
        over = f > MAX_FREQUENCY
        if not over.any():
            break
        excess = (f[over] - MAX_FREQUENCY).sum()
        f[over] = MAX_FREQUENCY
        f[~over] += excess * f[~over] / f[~over].sum()
    return f


def calibrate_scales(target: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Row scales (mean 1) whose Gaussian scores give each expert its target top-k frequency, as
    near as they can (`selection_frequencies` of scaled scores says how near)."""
    n = len(target)
    scales = np.ones(n)
    if k >= n:
        return scales
    z = rng.standard_normal((CALIBRATION_SAMPLES, n))
    for _ in range(CALIBRATION_STEPS):
        freq = selection_frequencies(z * scales, k)
        scales *= np.sqrt(target / np.maximum(freq, 1.0 / CALIBRATION_SAMPLES))
        scales /= scales.mean()  # only ratios matter
    return scales


def selection_frequencies(scores: np.ndarray, k: int) -> np.ndarray:
    """Share of rows (tokens) in which each column (expert) is among the k highest."""
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return np.bincount(top.ravel(), minlength=scores.shape[1]) / scores.shape[0]


class RouterRows:
    """Produces each layer's router matrix [n_expert, n_embd], layers in order."""

    def __init__(self, routing: Routing, n_expert: int, k: int, std: float, rng: np.random.Generator):
        self.routing, self.std, self.rng = routing, std, rng
        target = target_frequencies(n_expert, k, routing.skew)
        self.scales = calibrate_scales(target, k, rng)
        miss = np.abs(selection_frequencies(rng.standard_normal((CALIBRATION_SAMPLES, n_expert)) * self.scales, k)
                      - target).max()
        if miss > CALIBRATION_TOLERANCE:
            raise HypuraError(f"--router-skew {routing.skew:g} is more than router scales can give {n_expert} "
                              f"experts with top-{k} (an expert's frequency off by {miss:.2f}): try a smaller skew")
        self.prev: np.ndarray | None = None  # the last layer's unit-variance directions

    def next_layer(self, shape: tuple[int, int]) -> np.ndarray:
        fresh = self.rng.standard_normal(shape)
        c = self.routing.layer_corr
        directions = fresh if self.prev is None else c * self.prev + math.sqrt(1.0 - c * c) * fresh
        self.prev = directions
        order = self.rng.permutation(shape[0])  # which expert gets which popularity rank
        # rows orthogonal to the all-ones direction: synthetic hidden states carry a common offset
        # there (random K-quant blocks have a non-zero mean), which would favour experts at random
        centred = directions - directions.mean(axis=1, keepdims=True)
        return (centred * (self.std * self.scales[order])[:, None]).astype(np.float32)
