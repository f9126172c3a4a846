"""Expert caches on the CPU (slots in host memory): the same protocol as on the GPU (router hook,
slot ids, loads, prefetch), checked for bitwise logits, exact hit counts and persisted statistics."""

import threading

import numpy as np
import pytest

import hypura
from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.runtime.moe.coactivation import CoactivationPredictor, model_key
from hypura.runtime.mechanism import TierStats
from hypura.runtime.moe.expert_cache import ExpertSlots
from hypura.runtime.moe.expert_streaming import ExpertCacheSettings, ExpertStreamer, slots_for_budget
from hypura.runtime.stats import describe
from routing_trace import RoutingTrace

_NO_PHASE = {"tokens": 0}
K, LAYERS = 4, (0, 1)  # tiny-qwen3moe: top-4 of 16 experts, 2 MoE layers
TEXT = b"The quick brown fox jumps over the lazy dog. " * 3


def _decode(model, n_threads=1, traced=False, **kwargs):
    """Token-by-token logits (every batch is a decode batch: the cache serves it), the routing (traced:
    through on_route, which makes every batch call Python) and stats. Untraced, the stream answers
    batches of ready experts in C."""
    trace = RoutingTrace(16, K)
    llm = hypura.Llama(str(model), n_ctx=256, logits_all=True, n_threads=n_threads, verbose=False,
                       on_route=trace.record if traced else None, **kwargs)
    try:
        llm.reset()
        out = []
        for t in llm.tokenize(TEXT):
            llm.eval([t])
            out.append(np.array(llm.scores[llm.n_tokens - 1], copy=True))
        return np.array(out), trace, llm.stats().get("experts")
    finally:
        llm.close()


@pytest.fixture(scope="module")
def reference(tiny_qwen3moe):
    # plain host buffers (no repacking), as the cache runs use: the same CPU kernels throughout
    logits, trace, _ = _decode(tiny_qwen3moe, traced=True,
                               param_overrides={"model_params": {"use_extra_bufts": False}})
    return logits, trace


@pytest.mark.parametrize("slots,policy,traced", [(4, "lru", False), (6, "decay", False), (6, "decay", True),
                                                 (9, "lfu", False), (16, "decay", False)])
def test_logits_equal_for_any_cache_size(tiny_qwen3moe, reference, slots, policy, traced):
    logits, trace, ex = _decode(tiny_qwen3moe, traced=traced,
                                expert_cache=ExpertCacheSettings(slots=slots, policy=policy))
    assert np.array_equal(logits, reference[0])
    assert ex["accesses"] == len(logits) * K * len(LAYERS)
    assert 0 < ex["loaded_bytes"]["demand"]
    if traced:  # the hook saw what the routers chose, as without a cache
        assert all(np.array_equal(trace.selections(layer), reference[1].selections(layer)) for layer in LAYERS)


def test_hit_counts_match_a_hand_computed_trace(tiny_qwen3moe, reference):
    _, trace = reference
    # 16 slots hold every expert: each (layer, expert) misses once, at its first use
    _, _, ex = _decode(tiny_qwen3moe, expert_cache=ExpertCacheSettings(slots=16, prefetch=0))
    accesses = sum(trace.selections(layer).size for layer in LAYERS)
    first_uses = sum(len(np.unique(trace.selections(layer))) for layer in LAYERS)
    assert ex["accesses"] == accesses
    assert ex["hit_rate"]["host slots"] == pytest.approx(1 - first_uses / accesses)
    # k slots with LRU hold exactly the previous token's experts: hits are the overlaps
    _, _, ex = _decode(tiny_qwen3moe, expert_cache=ExpertCacheSettings(slots=K, policy="lru", prefetch=0))
    hits = sum(len(set(a) & set(b)) for layer in LAYERS
               for a, b in zip(trace.selections(layer), trace.selections(layer)[1:]))
    assert ex["hit_rate"]["host slots"] == pytest.approx(hits / accesses)
    assert ex["prefetch"]["issued"] == 0


def test_coactivation_counts_persist_and_warm_start(tiny_qwen3moe, reference):
    key = model_key(read_header(tiny_qwen3moe))
    assert not CoactivationPredictor.path_for(key).exists()
    _decode(tiny_qwen3moe, expert_cache=6)
    saved = CoactivationPredictor.load(key, len(LAYERS), 16).counts
    n_tokens = len(reference[1].selections(0))
    assert saved.sum() == n_tokens * K * K  # layer 0 -> 1: every token's k x k pairs
    _, _, ex = _decode(tiny_qwen3moe, expert_cache=6)  # warm: predictions from the first run
    pf = ex["prefetch"]
    assert pf["issued"] > 0 and pf["precision"] > 0 and pf["precision"] == pf["used"] / pf["issued"]
    # loads are copies on the hook's thread without a GPU: never in flight when a layer needs them
    assert pf["late"] == 0 and pf["used"] + pf["wasted"] <= pf["issued"] and pf["wasted"] > 0
    line = next(s for s in describe({"prefill": _NO_PHASE, "decode": _NO_PHASE, "experts": ex})
                if s.startswith("experts:"))
    assert f"prefetch {pf['issued']} issued: {pf['used']} used (0 late), {pf['wasted']} wasted" in line
    assert CoactivationPredictor.load(key, len(LAYERS), 16).counts.sum() == 2 * saved.sum()
    CoactivationPredictor.reset(key)
    assert not CoactivationPredictor.path_for(key).exists()


def test_bad_settings_are_clear_errors(tiny_qwen3moe, tiny_llama):
    with pytest.raises(HypuraError, match="at least 4 slots"):
        hypura.Llama(str(tiny_qwen3moe), n_ctx=64, verbose=False, expert_cache=3)
    with pytest.raises(HypuraError, match="unknown expert cache policy 'foo'"):
        ExpertCacheSettings(slots=6, policy="foo")
    with pytest.raises(HypuraError, match="no MoE router"):
        hypura.Llama(str(tiny_llama), n_ctx=64, verbose=False, expert_cache=8)
    with pytest.raises(HypuraError, match="no stacked experts"):
        slots_for_budget(read_header(tiny_llama), 1 << 30)
    assert slots_for_budget(read_header(tiny_qwen3moe), 1 << 40) > 1000


class _Ticket:
    """A load the loader thread finishes when waited for: as a copy still in flight is."""

    def __init__(self, done: bool):
        self.done = threading.Event()
        if done:
            self.done.set()

    def wait(self):
        self.done.set()


def test_a_layer_that_waits_for_its_prefetches_counts_them_late():
    streamer = ExpertStreamer.__new__(ExpertStreamer)  # its accounting only: no model, no C cache
    streamer.stats = TierStats()
    layer = ExpertSlots(1, 4, "lru")
    layer.ticket = None
    assert not streamer._wait(layer)  # nothing in flight
    for done in (True, False):
        layer.ticket = _Ticket(done)
        assert streamer._wait(layer) is not done and layer.ticket is None
