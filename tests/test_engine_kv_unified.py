"""EngineConfig.kv_unified with SmolLM2-135M: the sequences present share a cache of 256 cells (4 sequences of
64 tokens each when the switch is off). A sequence may hold the whole cache; a request waits, its place in the
queue in the metrics, until its cells fit; where they run out the youngest sequence is preempted and recomputed,
its stream going on without a gap or a repeat; every answer's greedy text is its text alone (tests/greedy.py).
The parts without a model: tests/test_engine_cells.py."""

import threading

import hypura
import pytest

from hypura.engine import PromptTooLong, SamplingParams, engine_llama_kwargs
from engine_helpers import SYSTEM, running
from greedy import COUNTING, assert_same_tokens, greedy

PARALLEL, SHARE = 4, 64  # 256 cells, llama.cpp's least (it pads n_ctx to 256)
# prompts whose greedy continuations SmolLM2 keeps decided for 48 tokens (every top-two gap >= MARGIN)
SHORT = [SYSTEM + COUNTING, SYSTEM + "Count: 11, 12, 13, 14, 15,", SYSTEM + "Count: 30, 31, 32, 33,"]
LONG = SYSTEM + SYSTEM + COUNTING  # 141 tokens: more than a sequence's share when the switch is off
N = 48


@pytest.fixture(scope="module")
def llm(smollm2_path, n_threads):
    llm = hypura.Llama(str(smollm2_path), n_threads=n_threads, n_threads_batch=n_threads,
                       **engine_llama_kwargs(PARALLEL, SHARE))
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def alone(llm):
    """Each prompt's tokens and its greedy continuation, one token a decode, nothing beside it."""
    out = {}
    for text in SHORT + [LONG]:
        tokens = llm.tokenize(text.encode())
        out[text] = tokens, greedy(llm, tokens, N)
    return out


def _greedy(n=N):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _streamed():
    """An on_event that records the tokens and text streamed, and those lists."""
    tokens, texts = [], []

    def on_event(ev):
        if ev.token is not None:
            tokens.append(ev.token)
        texts.append(ev.text)
    return on_event, tokens, texts


def test_a_sequence_may_hold_the_whole_cache_and_no_more(llm, alone):
    tokens, want = alone[LONG]
    with running(llm, parallel=PARALLEL) as engine:  # off: a sequence holds its share
        assert engine.n_ctx_per_seq == SHARE and engine.metrics()["kv_unified"] == 0
        with pytest.raises(PromptTooLong):
            engine.submit(tokens, _greedy())
    with running(llm, parallel=PARALLEL, kv_unified=True) as engine:
        assert engine.n_ctx_per_seq == PARALLEL * SHARE  # the whole cache (SmolLM2 was trained on 8192)
        r = engine.submit(tokens, _greedy(16)).result(120)
        with pytest.raises(PromptTooLong, match="a sequence holds 256"):
            engine.submit((tokens * 2)[:256], _greedy())
        m = engine.metrics()
    assert r.finish_reason == "length"
    assert_same_tokens(r.tokens, want.first(16), 16)
    assert m["kv_unified"] == 1 and m["cells"]["total"] == 256 and m["cells"]["running"] == 0
    assert m["cells"]["used"] == len(tokens) + 15  # its KV stays cached: the last token was never decoded


@pytest.mark.slow
def test_a_request_that_does_not_fit_waits_in_the_queue_then_completes(llm, alone):
    long, want_long = alone[LONG]
    other = llm.tokenize((SYSTEM + SYSTEM + "Count: 30, 31, 32, 33,").encode())
    want_other = greedy(llm, other, 24)
    seen = []
    # without the prefix cache the two share no cells: 141 + 16 held back for the first, 127 + 16 for the
    # second, more than 256
    with running(llm, parallel=PARALLEL, kv_unified=True, prefix_cache=False) as engine:
        first = engine.submit(long, _greedy(24),
                              on_event=lambda ev: seen.append(engine.metrics()) if not seen else None)
        second = engine.submit(other, _greedy(24))
        results = [first.result(120), second.result(120)]
        m = engine.metrics()
    waiting = seen[0]  # while the first decoded its first token
    assert waiting["requests"]["queued"] == 1 and waiting["requests"]["active"] == 1
    assert [(q["id"], q["position"], q["resumed"]) for q in waiting["queue"]] == [(second.id, 0, False)]
    assert waiting["cells"]["head_blocked"] == 1
    assert results[1].queued_s > results[0].queued_s
    assert_same_tokens(results[0].tokens, want_long.first(24), 16)
    assert_same_tokens(results[1].tokens, want_other, 16)
    assert m["queue"] == [] and m["cells"]["head_blocked"] == 0 and m["preempted"] == 0


@pytest.mark.slow
def test_fewer_cells_than_the_clients_ask_each_answered_in_full_through_preemption(llm, alone):
    """Three clients ask 87 + 48, 76 + 48 and 72 + 48 cells of 256: the first two are admitted together and
    grow until the cache is full; the younger is preempted, recomputed once the older is done, and the third
    waits its turn. Each stream is its greedy text alone, whole: no token lost or repeated."""
    streams = []
    with running(llm, parallel=PARALLEL, kv_unified=True, prefix_cache=False) as engine:
        requests = []
        for text in SHORT:
            on_event, tokens, texts = _streamed()
            streams.append((tokens, texts))
            requests.append(engine.submit(alone[text][0], _greedy(), on_event=on_event))
        results = [r.result(300) for r in requests]
        m = engine.metrics()
    assert sum(len(alone[t][0]) + N for t in SHORT) > 256
    assert m["preempted"] >= 1 and m["recomputed_tokens"] > 0
    assert m["requests"]["by_reason"]["length"] == 3 and m["generated_tokens"] == 3 * N
    for text, r, (tokens, texts) in zip(SHORT, results, streams):
        assert r.finish_reason == "length" and len(r.tokens) == N
        assert tokens == list(r.tokens) and "".join(texts) == r.text  # one stream, nothing twice, nothing lost
        assert_same_tokens(r.tokens, alone[text][1], 40)


def test_a_prefix_shared_with_a_running_sequence_is_reused(llm, alone):
    """With the prefix cache, the second prompt's system prompt is the first's cells (evaluated by then)."""
    a, b = (alone[t][0] for t in SHORT[:2])
    started = threading.Event()
    with running(llm, parallel=PARALLEL, kv_unified=True) as engine:
        ra = engine.submit(a, _greedy(16), on_event=lambda ev: started.set())
        assert started.wait(120)
        rb = engine.submit(b, _greedy(16))
        results = [ra.result(120), rb.result(120)]
        m = engine.metrics()
    assert results[1].cached_tokens > 30 and m["preempted"] == 0
    for text, r in zip(SHORT[:2], results):
        assert_same_tokens(r.tokens, alone[text][1].first(16), 16)


@pytest.mark.slow
def test_a_preempted_request_cancelled_while_it_waits_ends_with_what_it_streamed(llm, alone):
    """The second of two clients that fill the cache is preempted; cancelled then, from the first one's
    stream, its result is the tokens it had streamed, finish_reason "cancelled"."""
    cancelled = []
    with running(llm, parallel=PARALLEL, kv_unified=True, prefix_cache=False) as engine:
        def on_first(ev):
            resumed = [q for q in engine.metrics()["queue"] if q["resumed"]]
            if resumed and not cancelled:
                cancelled.append(resumed[0]["id"])
                second.cancel()
        on_event, tokens, _ = _streamed()
        first = engine.submit(alone[SHORT[0]][0], _greedy(), on_event=on_first)
        second = engine.submit(alone[SHORT[1]][0], _greedy(), on_event=on_event)
        results = first.result(300), second.result(300)
        m = engine.metrics()
    assert cancelled == [second.id] and m["preempted"] == 1
    assert results[0].finish_reason == "length" and len(results[0].tokens) == N
    assert results[1].finish_reason == "cancelled" and 0 < len(results[1].tokens) < N
    assert tokens == list(results[1].tokens)
    assert m["requests"]["active"] == 0 and m["requests"]["queued"] == 0 and m["cells"]["running"] == 0


@pytest.mark.slow
def test_speculation_beside_shared_cells_keeps_the_greedy_text(smollm2_path, alone):
    """n-gram drafts ride the steps while cells last and are dropped where they do not; the youngest is still
    preempted and recomputed, and every answer is its greedy text alone."""
    from hypura.engine import EngineConfig, load
    from hypura.speculative.settings import SpecSettings

    spec = SpecSettings(type="ngram-simple", ngram_size_n=3, n_min=4, n_max=4)
    llm, engine = load(smollm2_path, PARALLEL, SHARE, config=EngineConfig(kv_unified=True, prefix_cache=False,
                                                                           speculative=spec),
                       n_threads=1, n_threads_batch=1)
    try:
        requests = [engine.submit(alone[t][0], _greedy()) for t in SHORT]
        results = [r.result(300) for r in requests]
        m = engine.metrics()
    finally:
        engine.close()
        llm.close()
    assert m["preempted"] >= 1 and m["speculative"]["passes"] > 0
    for text, r in zip(SHORT, results):
        assert r.finish_reason == "length" and len(r.tokens) == N
        assert_same_tokens(r.tokens, alone[text][1], 40)


@pytest.mark.slow
def test_with_a_shared_system_prompt_a_preempted_sequence_is_not_preempted_again_and_again(llm, alone):
    """The third client shares the first's system prompt (its cells): the cache holds all three until they
    grow, then the youngest are preempted; each comes back once it may finish beside the others, not sooner."""
    from hypura.engine import Engine, EngineConfig

    engine = Engine(llm.loaded, EngineConfig(parallel=PARALLEL, kv_unified=True))
    try:
        requests = [engine.submit(alone[t][0], _greedy()) for t in SHORT]  # queued together, then started
        engine.start()
        results = [r.result(300) for r in requests]
        m = engine.metrics()
    finally:
        engine.close()
    assert 1 <= m["preempted"] <= len(SHORT) and m["cached_tokens"] > 30
    for text, r in zip(SHORT, results):
        assert r.finish_reason == "length" and len(r.tokens) == N
        assert_same_tokens(r.tokens, alone[text][1], 40)
