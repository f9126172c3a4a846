"""The batched engine on SmolLM2-135M (CPU, one thread): continuous batching, chunked prompts, cancellation,
prefix reuse, limits, metrics. Sampling: tests/test_engine_sampling.py; the queue, close and errors:
tests/test_engine_lifecycle.py; batch-equals-alone under every plan: tests/test_engine_batch.py."""

import threading
import time

import llama_cpp
import pytest

from hypura.engine import PromptTooLong, SamplingParams
from hypura.errors import HypuraError

from engine_helpers import PARALLEL, N_CTX, GREEDY, PROMPT, SYSTEM, LONG, running, kv_positions, engine_llm
from greedy import COUNTING, assert_same_tokens, greedy


@pytest.fixture(scope="module")
def llm(smollm2_path, n_threads):
    yield from engine_llm(smollm2_path, n_threads)


def test_greedy_output_is_llama_cpp_pythons(llm, smollm2_path, n_threads):
    vanilla = llama_cpp.Llama(str(smollm2_path), n_ctx=N_CTX, n_threads=n_threads, flash_attn=True, verbose=False)
    try:
        want = vanilla.create_completion(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"]
    finally:
        vanilla.close()
    with running(llm) as engine:
        got = engine.submit(engine.tokenize(PROMPT), GREEDY).result(60)
    assert got.text == want and got.finish_reason == "length" and got.completion_tokens == 16
    assert got.prompt_tokens == len(llm.tokenize(PROMPT.encode())) and got.cached_tokens == 0
    assert got.queued_s >= 0 and got.prompt_s > 0 and got.decode_s > 0


def test_sequences_join_and_leave_between_steps(llm):
    log, lock = [], threading.Lock()

    def tap(name):
        def on_event(ev):
            with lock:
                log.append((name, ev.finish_reason))
        return on_event

    with running(llm, parallel=2) as engine:
        tokens = engine.tokenize(PROMPT)
        a = engine.submit(tokens, SamplingParams(max_tokens=12, temperature=0.0), on_event=tap("a"))
        b = engine.submit(tokens, SamplingParams(max_tokens=4, temperature=0.0), on_event=tap("b"))
        c = engine.submit(tokens, SamplingParams(max_tokens=4, temperature=0.0), on_event=tap("c"))  # waits
        results = [r.result(60) for r in (a, b, c)]
        m = engine.metrics()
    assert [r.completion_tokens for r in results] == [12, 4, 4]
    # c took b's slot once b left, while a went on decoding
    assert log.index(("c", None)) > log.index(("b", "length")) and log.index(("a", "length")) > log.index(("c", None))
    assert results[2].queued_s > results[1].queued_s
    assert m["requests"]["finished"] == 3 and m["requests"]["active"] == 0 and m["generated_tokens"] == 20
    assert m["decode"]["steps"] + m["prefill"]["steps"] == m["steps"] < 20  # steps were shared


@pytest.mark.slow
def test_a_long_prompt_is_chunked_and_the_running_sequence_keeps_decoding(llm):
    long_tokens = llm.tokenize((SYSTEM + COUNTING).encode())  # a continuation decided for every token
    want = greedy(llm, long_tokens, GREEDY.max_tokens)
    with running(llm, parallel=2, step_tokens=16) as engine:
        assert len(long_tokens) > 4 * 16
        a_tokens = []
        a = engine.submit(engine.tokenize(PROMPT), SamplingParams(max_tokens=40, temperature=0.0),
                          on_event=lambda ev: a_tokens.append(ev.token))
        while not a_tokens:
            time.sleep(0.01)
        seen = {}
        b = engine.submit(long_tokens, GREEDY, on_event=lambda ev: seen.setdefault("first", len(a_tokens)))
        b_result = b.result(120)
        a.result(120)
        m = engine.metrics()
    # a decoded one token in each of the steps that carried b's prompt chunks (15 tokens a step beside a's)
    assert seen["first"] - 1 >= len(long_tokens) // 15
    assert m["prefill"]["steps"] >= len(long_tokens) // 15
    # chunks of 15 beside a's decoding and of 16 alone run other kernels (tests/greedy.py): each is held to
    # one-token decoding up to its first near-tie
    assert_same_tokens(b_result.tokens, want, at_least=16)
    with running(llm, parallel=2, step_tokens=16) as engine:
        assert_same_tokens(engine.submit(long_tokens, GREEDY).result(120).tokens, want, at_least=16)


def test_cancel_frees_the_sequence_and_its_kv_at_once(llm):
    with running(llm, parallel=1) as engine:
        tokens = engine.tokenize(PROMPT)
        got = []
        a = engine.submit(tokens, SamplingParams(max_tokens=200, temperature=0.0), on_event=got.append)
        queued = engine.submit(tokens, GREEDY)  # waits for the one slot
        while len(got) < 3:
            time.sleep(0.01)
        a.cancel()
        r = a.result(30)
        assert r.finish_reason == "cancelled" and 3 <= r.completion_tokens < 200 and r.error is None
        assert got[-1].finish_reason == "cancelled" and "".join(e.text for e in got) == r.text
        after = queued.result(60)  # the next request got the slot and its cells
        assert after.finish_reason == "length" and after.cached_tokens == 0  # the cancelled KV was not kept
        assert engine.metrics()["requests"]["by_reason"]["cancelled"] == 1
        a.cancel()  # a no-op once done


def test_every_metrics_snapshot_adds_up_while_requests_come_and_go(llm):
    # a request between the queue and its slot, or between its slot's release and its count, is active:
    # an engine that looks idle has counted every request finished (a server's test waits on exactly that)
    snapshots, done = [], threading.Event()

    def poll(engine):
        while not done.is_set():
            snapshots.append(engine.metrics()["requests"])

    with running(llm, parallel=2) as engine:
        watcher = threading.Thread(target=poll, args=(engine,))
        watcher.start()
        try:
            tokens = engine.tokenize(PROMPT)
            for _ in range(6):
                a = engine.submit(tokens, SamplingParams(max_tokens=4, temperature=0.0))
                b = engine.submit(tokens, SamplingParams(max_tokens=200, temperature=0.0))
                queued = engine.submit(tokens, SamplingParams(max_tokens=2, temperature=0.0))
                a.result(60)
                b.cancel()
                queued.cancel()
                b.result(60)
                queued.result(60)
        finally:
            done.set()
            watcher.join()
        last = engine.metrics()["requests"]
    # about one a step (metrics() waits for the step lock): a few a round even on a machine that starves the poller
    assert len(snapshots) > 6
    for m in snapshots:
        assert m["total"] == m["finished"] + m["active"] + m["queued"], m
        assert m["finished"] == sum(m["by_reason"].values()) and 0 <= m["active"] <= 3, m
    assert last["finished"] == 18 and last["active"] == 0 and last["queued"] == 0


def test_a_cancelled_request_leaves_the_queue_and_a_cancelled_sequence_holds_no_kv(llm):
    with running(llm, parallel=1) as engine:
        tokens = engine.tokenize(PROMPT)
        first = []
        a = engine.submit(tokens, SamplingParams(max_tokens=60, temperature=0.0), on_event=first.append)
        b = engine.submit(tokens, GREEDY)
        b.cancel()
        rb = b.result(30)
        assert rb.finish_reason == "cancelled" and rb.tokens == () and rb.prompt_s == 0.0
        assert not a.done  # b left the queue before a finished
        while len(first) < 2:
            time.sleep(0.01)
        a.cancel()
        a.result(30)
        assert kv_positions(engine, 0) == (-1, -1)


@pytest.mark.slow
def test_a_shared_prefix_is_reused_and_changes_nothing(llm):
    q1, q2 = SYSTEM + "Q: What is 2 + 2? A:", SYSTEM + "Q: Name a color. A:"
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)  # 16 tokens, whatever they are
    with running(llm, prefix_cache=False) as engine:
        want = [engine.submit(engine.tokenize(q), greedy).result(60) for q in (q1, q2)]
    with running(llm) as engine:
        t1, t2 = engine.tokenize(q1), engine.tokenize(q2)
        r1 = engine.submit(t1, greedy).result(60)
        r2 = engine.submit(t2, greedy).result(60)  # the system prompt's KV is copied from r1's slot
        common = next(i for i, (x, y) in enumerate(zip(t1, t2)) if x != y)
        assert r1.cached_tokens == 0 and r2.cached_tokens == common > 40
        # the next turn of a chat: the whole earlier exchange is in the KV cache
        turn = t1 + list(r1.tokens) + engine.tokenize(" Q: And 3 + 3? A:", add_special=False)
        r3 = engine.submit(turn, greedy).result(60)
        assert r3.cached_tokens == len(t1) + len(r1.tokens) - 1  # all but r1's last token, never decoded
        m = engine.metrics()
    with running(llm, prefix_cache=False) as engine:
        want3 = engine.submit(turn, greedy).result(60)
    assert [r1.tokens, r2.tokens, r3.tokens] == [want[0].tokens, want[1].tokens, want3.tokens]
    assert m["cached_tokens"] == r2.cached_tokens + r3.cached_tokens
    assert m["prefill"]["tokens"] == len(t1) + len(t2) + len(turn) - m["cached_tokens"]


@pytest.mark.slow
def test_max_tokens_eos_and_the_context_end_a_request(llm):
    chat = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    with running(llm) as engine:
        assert engine.submit(engine.tokenize(PROMPT), SamplingParams(max_tokens=5, temperature=0.0)).result(60) \
            .completion_tokens == 5
        eos = engine.submit(engine.tokenize(chat), SamplingParams(max_tokens=100, temperature=0.0)).result(60)
        assert eos.finish_reason == "stop" and 0 < eos.completion_tokens < 100  # <|im_end|>: not a token of it
        assert eos.text == engine.detokenize(list(eos.tokens))
        past = engine.submit(engine.tokenize(chat), SamplingParams(max_tokens=eos.completion_tokens + 3,
                                                                   temperature=0.0, ignore_eos=True)).result(60)
        assert past.finish_reason == "length" and past.tokens[: eos.completion_tokens] == eos.tokens
        # a sequence holds prompt and generated tokens: a prompt 3 short of it gets 3 tokens
        near_full = list(engine.tokenize(LONG))[: engine.n_ctx_per_seq - 3]
        r = engine.submit(near_full, SamplingParams(max_tokens=-1, temperature=0.0, ignore_eos=True)).result(60)
        assert r.finish_reason == "length" and r.completion_tokens == 3


@pytest.mark.slow
def test_a_prompt_that_leaves_no_room_is_refused(llm):
    with running(llm) as engine:
        tokens = list(engine.tokenize(LONG))
        assert engine.n_ctx_per_seq == N_CTX
        with pytest.raises(PromptTooLong, match=f"{N_CTX} tokens; a sequence holds {N_CTX}"):
            engine.submit(tokens[:N_CTX], GREEDY)
        r = engine.submit(tokens[: N_CTX - 1], GREEDY).result(60)
        assert r.completion_tokens == 1 and r.finish_reason == "length"
        with pytest.raises(HypuraError, match="empty prompt"):
            engine.submit([], GREEDY)
        with pytest.raises(HypuraError, match="token"):
            engine.submit([engine.n_vocab], GREEDY)


def test_text_round_trips_and_metrics_add_up(llm):
    llm.stats(reset=True)
    with running(llm) as engine:
        text = "héllo 日本語 🙂"
        assert engine.detokenize(engine.tokenize(text, add_special=False)) == text
        r = engine.submit(engine.tokenize(PROMPT), GREEDY).result(60)
        m = engine.metrics()
    assert m["requests"] == {"total": 1, "active": 0, "queued": 0, "finished": 1,
                             "by_reason": {"stop": 0, "length": 1, "cancelled": 0, "error": 0}}
    assert m["generated_tokens"] == 16 and m["decode"]["tokens"] == 15 and m["prefill"]["tokens"] == r.prompt_tokens
    assert m["decode_tok_s"] > 0 and m["prefill_tok_s"] > 0 and m["parallel"] == PARALLEL
    assert m["llm"]["decode"]["tokens"] == 15 and m["llm"]["prefill"]["calls"] == 1  # llm.stats() by phase
