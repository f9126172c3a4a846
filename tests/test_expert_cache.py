"""Expert caches, their counters and the co-activation predictor: against hand-computed routing traces,
persisted statistics, and a real routing trace of a synthetic MoE model. The caches are the runtime's own
accounting (ExpertSlots, which expert_streaming.py's layers are), driven without a model."""

import math

import numpy as np
import pytest

import hypura
from hypura.modelfile import read_header
from hypura.runtime.moe.coactivation import CoactivationPredictor, model_key
from hypura.plan.experts import expected_hit_rate
from hypura.errors import HypuraError
from hypura.runtime.mechanism import TierStats
from hypura.runtime.moe.expert_cache import ExpertSlots, LayerCache
from routing_trace import RoutingTrace
from hypura.synth.routing import Routing
from hypura.synth.writer import write_synth


def _serve(cache: ExpertSlots, stats: TierStats, experts) -> list[str]:
    """One token's selected experts through the runtime's accounting, its loads then complete (as
    expert_streaming.py waits for them); where each was served from."""
    served = ["gpu" if e in cache.slot_of else "ram" for e in experts]
    cache.access([list(experts)], stats, "gpu")
    cache.ready()
    return served


def test_lru_counts_match_a_hand_computed_trace():
    # one layer, 2 slots over the experts in RAM, k = 1 per token
    cache, stats = ExpertSlots(0, 2, "lru"), TierStats()
    served = [_serve(cache, stats, [e])[0] for e in (0, 1, 0, 2, 1, 3, 0)]
    # 0,1 miss; 0 hit; 2 misses (evicts 1, the least recent); 1 misses (evicts 0); 3 evicts 2; 0 evicts 1
    assert served == ["ram", "ram", "gpu", "ram", "ram", "ram", "ram"]
    assert stats.accesses == 7 and stats.hits == {"ram": 6, "gpu": 1}
    assert stats.hit_rate("gpu") == pytest.approx(1 / 7) and sorted(cache.slot_of) == [0, 3]


def test_lfu_keeps_the_popular_expert_where_lru_drops_it():
    trace = [0, 0, 0, 1, 2, 0]  # 1 and 2 pass through once; 0 is popular

    def hits(policy, slots):
        cache, stats = ExpertSlots(0, slots, policy), TierStats()
        for e in trace:
            _serve(cache, stats, [e])
        return stats.hits["gpu"]

    assert hits("lru", 1) == hits("lfu", 1) == 2  # the 2nd and 3rd 0: with 1 slot every miss evicts
    # with 2 slots LFU keeps 0 through the 1, 2 scan; LRU evicts it for 2, then misses the last 0
    assert hits("lfu", 2) == 3 and hits("lru", 2) == 2


def test_experts_a_token_needs_are_never_evicted_for_each_other():
    cache, stats = ExpertSlots(0, 3, "lru"), TierStats()
    _serve(cache, stats, [0, 1, 2])
    slot_of_2 = cache.slot_of[2]
    # 0 is the least recent, but this token needs it: 3 takes the slot of 2, the only one it does not need
    assert _serve(cache, stats, [3, 0, 1]) == ["ram", "gpu", "gpu"]
    assert cache.slot_of[3] == slot_of_2 and sorted(cache.slot_of) == [0, 1, 3]
    with pytest.raises(HypuraError, match="layer 0: no slot left for expert 2 .3 needed at once"):
        ExpertSlots(0, 2, "lru").access([[0, 1, 2]], TierStats(), "gpu")


def test_prefetch_precision_and_recall():
    layers, stats = [ExpertSlots(layer, 4, "lru") for layer in (0, 1)], TierStats()
    _serve(layers[0], stats, [0, 1])
    assert layers[1].prefetch([2, 3], stats) == [(2, 0), (3, 1)]  # (expert, slot) loads to make
    layers[1].ready()
    _serve(layers[1], stats, [2, 5])  # 2 was prefetched and used, 3 was not; 5 was not predicted
    assert stats.prefetched == 2 and stats.prefetch_used == 1
    assert stats.precision == 0.5 and stats.recall == pytest.approx(1 / 4)  # 1 of 4 accesses came from a prefetch
    assert stats.hits["gpu"] == 1
    assert stats.prefetch_late == stats.prefetch_wasted == 0  # 3 is still cached: not wasted yet


def test_prefetches_used_late_and_wasted():
    """A used prefetch counts once, late where compute waited for its load; one evicted unused is wasted."""
    cache, stats = ExpertSlots(1, 5, "lru"), TierStats()
    assert len(cache.prefetch([0, 1, 2], stats)) == 3
    cache.ready()
    cache.access([[0, 1, 5, 6]], stats, "gpu", late=True)  # the loads of 0 and 1 were still in flight
    cache.ready()
    assert (stats.prefetch_used, stats.prefetch_late, stats.prefetch_wasted) == (2, 2, 0)
    cache.access([[0, 1, 5, 6]], stats, "gpu", late=True)  # used already: counted once
    cache.access([[7, 0, 1, 5]], stats, "gpu")  # 7 takes the slot of 2, prefetched and never used
    cache.ready()
    assert (stats.prefetch_used, stats.prefetch_late, stats.prefetch_wasted) == (2, 2, 1)
    assert cache.prefetch([8], stats) == [(8, cache.slot_of[8])]  # evicts 6, which a demand load brought
    assert stats.prefetch_wasted == 1
    assert stats.prefetch_dict() == {"issued": 4, "used": 2, "late": 2, "wasted": 1, "precision": 0.5,
                                     "recall": pytest.approx(2 / 12)}


def test_predictor_learns_and_persists(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("HYPURA_ROUTING_DIR")  # the default place
    p = CoactivationPredictor(n_layer=3, n_expert=4)
    for _ in range(5):
        p.observe(0, [0], [2])
    p.observe(0, [0], [3])
    p.observe(1, [2], [1])
    assert p.predict(0, [0], 2) == [2, 3] and p.predict(0, [1], 2) == [] and p.predict(2, [0], 1) == []
    p.select_many([(0, [[0, 1], [0, 2]]), (2, [[3, 1]]), (5, [[0, 1]])])  # layer 5 does not exist: ignored
    assert p.selections.tolist() == [[2, 1, 1, 0], [0, 0, 0, 0], [0, 1, 0, 1]] and p.tokens(2).tolist() == [2, 0, 1]
    path = p.save("abc")
    assert path.parent == tmp_path / "hypura" / "coactivation"
    warm = CoactivationPredictor.load("abc", 3, 4)
    assert np.array_equal(warm.counts, p.counts) and np.array_equal(warm.selections, p.selections)
    assert not CoactivationPredictor.load("abc", 3, 8).counts.any()  # another shape: cold
    CoactivationPredictor.reset("abc")
    assert not CoactivationPredictor.load("abc", 3, 4).counts.any()


def _routing_trace(folder, routing: Routing, n_threads: int):
    """A real routing trace of tiny-qwen3moe (16 experts, top-4) with synthetic routers."""
    path = folder / "moe.gguf"
    write_synth("tiny-qwen3moe", path, routing=routing)
    trace = RoutingTrace(16, 4)
    llm = hypura.Llama(str(path), n_ctx=1024, n_batch=512, logits_all=True, n_threads=n_threads, verbose=False,
                       on_route=trace.record)
    try:
        llm.eval([int(t) for t in np.random.default_rng(1).integers(0, llm.n_vocab(), 480)])
    finally:
        llm.close()
    return read_header(path), trace


@pytest.fixture(scope="module")
def skewed(tmp_path_factory, n_threads):
    return _routing_trace(tmp_path_factory.mktemp("skewed"), Routing(skew=2.0, layer_corr=0.9), n_threads)


@pytest.fixture(scope="module")
def correlated(tmp_path_factory, n_threads):
    return _routing_trace(tmp_path_factory.mktemp("correlated"), Routing(layer_corr=0.9), n_threads)


def test_policies_on_a_real_routing_trace(skewed):
    h, trace = skewed
    rates = {}
    for policy in ("lru", "lfu", "decay"):
        stats = TierStats()
        for layer in (0, 1):
            cache = ExpertSlots(layer, 6, policy)
            for token in trace.selections(layer).tolist():
                _serve(cache, stats, token)
        rates[policy] = stats.hit_rate("gpu")
    # the static best (6 most popular of 16 per layer) bounds what a cache of 6 can serve
    static = np.mean([expected_hit_rate(trace.frequencies(layer), 6) for layer in (0, 1)])
    assert 0.375 < max(rates.values()) <= static + 0.05  # 6/16 = 0.375: what uniform routing would give
    assert rates["lfu"] >= rates["lru"] - 0.02  # skewed, stationary routing: frequency beats recency
    assert rates["decay"] >= max(rates["lru"], rates["lfu"]) - 0.01  # measured 0.60, 0.57, 0.56: the default


def test_predictor_beats_popularity_on_a_real_routing_trace(correlated):
    h, trace = correlated
    a, b = trace.selections(0), trace.selections(1)
    half = len(a) // 2
    p = CoactivationPredictor(2, 16)
    for x, y in zip(a[:half], b[:half]):  # learn on the first half of the tokens, predict the rest
        p.observe(0, x, y)
    predicted = np.mean([len(set(p.predict(0, x, 4)) & set(y)) / 4 for x, y in zip(a[half:], b[half:])])
    popular = np.argsort(-np.bincount(b[:half].ravel(), minlength=16))[:4]
    static = np.mean([len(set(popular) & set(y)) / 4 for y in b[half:]])
    # measured: 0.50 against 0.24 for the 4 most popular experts (chance: 4/16)
    assert predicted > 0.42 and predicted > static + 0.15
    assert len(model_key(h)) == 24 and model_key(h) == model_key(read_header(h.path))


def test_decay_keeps_its_order_across_rescaling():
    """Scores rescale every 512 half-lives; the order must stay that of decayed frequencies."""
    c = LayerCache(3, "decay")
    for _ in range(40000):  # 625 half-lives: one rescale
        for e in (0, 1):
            c.touch(e)
    c.insert(2, set())
    c.touch(2)
    assert all(math.isfinite(v) for v in c.resident.values())
    assert c.resident[0] < c.resident[1]  # 1 was touched last
    assert c.resident[2] < c.resident[0]  # one recent access weighs less than many


def test_recorded_routing_plans_often_chosen_experts_into_ram(tiny_qwen3moe):
    from hypura.modelfile import read_header
    from hypura.plan import PlanSettings
    from hypura.profile import resolve_profile
    from hypura.runtime.moe.coactivation import MIN_TOKENS, CoactivationRecorder, moe_layers, routing_frequencies
    from hypura.plan.decision import Ask, Routing, decide

    def plan_with_routing(header, profile, gpu_mem, ram, settings):  # as hypura.Llama plans: with recorded routing
        ask = Ask(gpu_mem=gpu_mem, ram=ram, n_ctx=settings.n_ctx)
        return decide(header, ask, None, profile, routing=lambda: Routing(*routing_frequencies(header))).plan

    header = read_header(tiny_qwen3moe)
    layers = moe_layers(header)
    budgets = dict(gpu_mem=0, ram="138.8MiB", settings=PlanSettings(n_ctx=256))  # RAM for 2 of 16 experts (every disk slot as large as the largest)
    cold = plan_with_routing(header, resolve_profile("h200-design"), **budgets)
    assert cold.routing_tokens == 0 and routing_frequencies(header) == (None, 0)
    recorder = CoactivationRecorder(CoactivationPredictor(len(layers), 16), layers)
    def record(tokens):  # each token: experts 9 and 12 at both layers, two of experts 2..8 beside them
        for t in tokens:
            recorder.observe(layers[0], [[9, 12, 2 + t % 7, 2 + (t + 3) % 7]])
            recorder.observe(layers[1], [[12, 9, 2 + (t + 1) % 7, 2 + (t + 5) % 7]])
            recorder.flush()
        recorder.predictor.save(model_key(header))

    record(range(MIN_TOKENS - 1))
    assert routing_frequencies(header) == (None, MIN_TOKENS - 1)  # too few tokens to plan with
    record([MIN_TOKENS])
    probs, tokens = routing_frequencies(header)
    assert tokens == MIN_TOKENS and probs[layers[0]][9] == probs[layers[1]][12] == max(probs[layers[0]])
    warm = plan_with_routing(header, resolve_profile("h200-design"), **budgets)
    assert warm.routing_tokens == MIN_TOKENS
    in_ram = lambda plan: {(t.layer, e) for t in plan.tensors for e, tier in enumerate(t.experts) if tier == "ram"}  # noqa: E731
    assert in_ram(cold) == {(0, 0), (0, 1)}  # k/E for all: the first ones
    assert in_ram(warm) == {(0, 9), (0, 12)}  # the most chosen ones
    assert warm.traffic.disk_bytes < cold.traffic.disk_bytes  # the plan expects fewer disk reads a token


def test_recorded_counts_shrink_toward_uniform_as_far_as_sampling_noise_explains_them():
    from hypura.runtime.moe.coactivation import shrunk_counts

    rng = np.random.default_rng(0)
    n_expert, k, tokens = 128, 8, 512
    uniform = np.zeros(n_expert)
    for _ in range(tokens):  # uniform routing: the counts' spread is all noise
        uniform[rng.choice(n_expert, k, replace=False)] += 1
    shrunk = shrunk_counts(uniform, k)
    assert shrunk.sum() == pytest.approx(uniform.sum())
    assert np.ptp(shrunk) < 0.5 * np.ptp(uniform)
    skewed = np.zeros(n_expert)
    skewed[:k] = tokens  # the same k experts every token: no noise at all
    assert np.allclose(shrunk_counts(skewed, k), skewed, atol=1.0)
    assert np.array_equal(shrunk_counts(np.zeros(n_expert), k), np.ones(n_expert))  # nothing seen: uniform
