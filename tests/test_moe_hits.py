"""bench/moe_hits.py's replays of recorded routing: an LRU cache per layer, and the co-activation prediction a
layer ahead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def moe_hits():
    sys.path.insert(0, str(ROOT))
    try:
        import bench.moe_hits as module
    finally:
        sys.path.remove(str(ROOT))
    return module


def test_lru_evicts_the_least_recently_used(moe_hits):
    # capacity 2: a b a c -> c evicts b (a was used after it); then b misses, a misses (evicted by b), c hits
    seq = [(0, e) for e in "abacbac"]
    assert moe_hits.lru_hits(seq, {0: 2}) == (1, 7)  # only the second a hits; b, a, c each miss once more
    assert moe_hits.lru_hits(seq, {0: 3}) == (4, 7)  # everything fits after the first three misses


def test_lru_keeps_one_cache_per_group_and_skips_the_warm_up(moe_hits):
    seq = [(0, 1), (1, 1), (0, 2), (1, 2), (0, 1), (1, 1)]
    assert moe_hits.lru_hits(seq, {0: 2, 1: 1}) == (1, 6)  # group 0 holds 1 and 2; group 1 only the last
    assert moe_hits.lru_hits(seq, {0: 2, 1: 1}, warm=4) == (1, 2)  # the first 4 fill the caches, uncounted


def test_layer_ahead_learns_a_fixed_pairing_and_only_from_earlier_tokens(moe_hits):
    # layer 0 -> layer 1 always pairs {0,1} -> {2,3} and {4,5} -> {6,7}
    tokens = [[[0, 1], [2, 3]], [[4, 5], [6, 7]]] * 4
    out = moe_hits.layer_ahead(tokens, m=2)
    # the first two tokens had nothing to learn from; the six after are predicted exactly
    assert out["recall"] == pytest.approx(6 / 8)
    assert out["precision"] == 1.0
    assert moe_hits.layer_ahead(tokens, m=2, warm=2) == {"m": 2, "recall": 1.0, "precision": 1.0}


def test_the_optimal_cache_evicts_the_key_used_again_last_and_never_loses_to_lru(moe_hits):
    seq = [(0, e) for e in "abcabdabcdab"]
    # capacity 2: a and b always come back before c or d does, so the optimum keeps them: they hit every round
    assert moe_hits.opt_hits(seq, {0: 2}) == (6, 12)
    assert moe_hits.lru_hits(seq, {0: 2}) == (0, 12)
    assert moe_hits.opt_hits(seq, {0: 2}, warm=6) == (4, 6)


def test_the_pagers_model_hits_its_fixed_experts_and_pages_the_rest_through_one_lru(moe_hits):
    seq = [(0, 1), (1, 5), (0, 2), (1, 5), (0, 1), (0, 2), (1, 6), (1, 5)]
    # layer 0's expert 1 is fixed (hits twice); the rest share one LRU of 2: 5 and 2 miss, then hit once each;
    # 6 evicts 5, which misses again
    assert moe_hits.fixed_then_lru_hits(seq, {0: {1}}, 2) == (4, 8)
    assert moe_hits.fixed_then_lru_hits(seq, {0: {1}}, 2, warm=4) == (2, 4)



def test_with_ram_experts_in_the_pagers_lru_its_model_is_the_lru_over_all_layers(moe_hits):
    import numpy as np

    # (step, layer, ids): the prompt (step 0) fills the caches with layer 0's 1 and 2; then routing moves away
    steps = [(0, [1, 2]), (0, [3, 4]), (1, [5, 6]), (0, [3, 4]), (1, [5, 6])]
    routes = [(s, layer, np.array([ids])) for s, (layer, ids) in enumerate(steps)]
    # a tie plan's pager: one LRU of all 4 experts; 3-6 miss once, then hit
    rates = moe_hits.replays(routes, {0: 2, 1: 2}, {}, staged=4)
    assert rates["modelled_ours"] == rates["lru_global"] == 0.5 and rates["selections"] == 8
    # 1 and 2 fixed: 3-6 take turns in an LRU of 2 and never hit
    assert moe_hits.replays(routes, {0: 2, 1: 2}, {0: {1, 2}}, staged=2)["modelled_ours"] == 0.0


def test_an_lru_of_bytes_holds_fewer_large_keys(moe_hits):
    seq = [(0, e) for e in "abab"]
    assert moe_hits.lru_hits(seq, {0: 2}, size=lambda key: 1) == (2, 4)
    assert moe_hits.lru_hits(seq, {0: 3}, size=lambda key: 2 if key == "b" else 1) == (2, 4)  # a and b fit in 3
    assert moe_hits.lru_hits(seq, {0: 3}, size=lambda key: 2) == (0, 4)  # one of them at a time
