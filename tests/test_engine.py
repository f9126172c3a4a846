"""The batched engine on SmolLM2-135M (CPU, one thread): continuous batching, chunked prompts, cancellation,
prefix reuse, stop strings, limits, seeds, the queue, errors, close. Batch-equals-alone under every plan:
tests/test_engine_batch.py."""

import contextlib
import errno
import os
import threading
import time

import llama_cpp
import pytest

import hypura
from hypura.engine import (Engine, EngineClosed, EngineConfig, PromptTooLong, QueueFull, SamplingParams,
                           engine_llama_kwargs)
from hypura.errors import HypuraError

PARALLEL, N_CTX = 4, 256
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
PROMPT = "The capital of France is"
SYSTEM = ("You are a careful assistant. You answer in one short sentence, you never guess, and you say so "
          "when you do not know. ") * 2
LONG = SYSTEM * 8  # more tokens than a sequence holds


@pytest.fixture(scope="module")
def llm(smollm2_path, n_threads):
    llm = hypura.Llama(str(smollm2_path), n_threads=n_threads, n_threads_batch=n_threads,
                       **engine_llama_kwargs(PARALLEL, N_CTX))
    yield llm
    llm.close()


@contextlib.contextmanager
def running(llm, **config):
    engine = Engine(llm, EngineConfig(**config)).start()
    try:
        yield engine
    finally:
        engine.close()


def kv_positions(engine, slot):
    mem = llama_cpp.llama_get_memory(engine.llm.ctx)
    return llama_cpp.llama_memory_seq_pos_min(mem, slot), llama_cpp.llama_memory_seq_pos_max(mem, slot)


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
    long_prompt = SYSTEM + "Q: What is the capital of France? A:"
    with running(llm, parallel=2, step_tokens=16) as engine:
        long_tokens = engine.tokenize(long_prompt)
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
    with running(llm, parallel=2, step_tokens=16) as engine:
        assert engine.submit(long_tokens, GREEDY).result(120).tokens == b_result.tokens  # as alone


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


def test_stop_strings_end_before_them_and_are_never_sent(llm):
    with running(llm) as engine:
        tokens = engine.tokenize(PROMPT)
        full = engine.submit(tokens, SamplingParams(max_tokens=24, temperature=0.0)).result(60)
        stop = full.text[12:17]  # spans tokens, well inside the text
        events = []
        r = engine.submit(tokens, SamplingParams(max_tokens=24, temperature=0.0, stop=("NEVER", stop)),
                          on_event=events.append).result(60)
    assert r.finish_reason == "stop" and r.text == full.text[: full.text.index(stop)]
    assert "".join(e.text for e in events) == r.text and r.completion_tokens < 24
    assert all(stop not in e.text for e in events) and events[-1].finish_reason == "stop"


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


def test_seeds_reproduce_samples_alone_and_in_a_batch(llm):
    tokens = llm.tokenize(PROMPT.encode())
    def warm(seed):
        return SamplingParams(max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)

    with running(llm) as engine:
        alone = engine.submit(tokens, warm(3)).result(60)
        batch = [engine.submit(tokens, warm(s)) for s in (3, 4, 3)]
        r3, r4, r3b = [r.result(60) for r in batch]
    assert alone.tokens == r3.tokens == r3b.tokens  # each sequence has its own sampler
    assert r4.tokens != r3.tokens


def test_penalties_see_the_prompt(llm):
    tokens = llm.tokenize(b"1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3,")
    with running(llm) as engine:
        plain = engine.submit(tokens, SamplingParams(max_tokens=6, temperature=0.0)).result(60)
        penalized = engine.submit(tokens, SamplingParams(max_tokens=6, temperature=0.0, repeat_penalty=5.0)).result(60)
    assert plain.text.startswith(" 1, 2,")
    assert penalized.tokens[0] != plain.tokens[0]  # the first sample already avoids the prompt's tokens


def test_a_full_queue_is_refused_and_close_ends_what_waits(llm):
    engine = Engine(llm, EngineConfig(parallel=1, max_queue=2))  # not started: everything waits
    tokens = llm.tokenize(PROMPT.encode())
    waiting = [engine.submit(tokens, GREEDY) for _ in range(2)]
    with pytest.raises(QueueFull, match="2 requests wait already"):
        engine.submit(tokens, GREEDY)
    with pytest.raises(TimeoutError):
        next(waiting[0].events(timeout=0.05))
    with pytest.raises(TimeoutError):
        waiting[0].result(timeout=0.05)
    engine.close()
    for r in waiting:
        res = r.result(1)
        assert res.finish_reason == "error" and res.error == "engine closed"
    with pytest.raises(EngineClosed):
        engine.submit(tokens, GREEDY)


def test_close_ends_running_requests_and_joins_the_thread(llm):
    engine = Engine(llm, EngineConfig(parallel=2)).start()
    thread = engine._thread  # this engine's (another test's server may still be closing its own)
    tokens = llm.tokenize(PROMPT.encode())
    got = []
    r = engine.submit(tokens, SamplingParams(max_tokens=200, temperature=0.0), on_event=got.append)
    while not got:
        time.sleep(0.01)
    engine.close()
    res = r.result(1)
    assert res.finish_reason == "error" and res.error == "engine closed" and 0 < res.completion_tokens < 200
    assert not thread.is_alive()
    engine.close()  # twice is fine


def test_a_failing_decode_ends_its_step_and_the_engine_keeps_serving(llm, monkeypatch):
    real, calls = llm.decode_batch, []

    def failing(batch, decode=False):
        calls.append(batch.n_tokens)
        if len(calls) == 1:
            return -3
        if len(calls) == 2:
            raise HypuraError("weights could not be streamed, the results are void: disk gone")
        return real(batch, decode)

    monkeypatch.setattr(llm, "decode_batch", failing)
    engine = Engine(llm)
    with contextlib.closing(engine):
        tokens = engine.tokenize(PROMPT)
        first = [engine.submit(tokens, GREEDY) for _ in range(2)]  # queued before the start: one step
        engine.start()
        errors = [r.result(60) for r in first]
        second = engine.submit(tokens, GREEDY).result(60)
        ok = engine.submit(tokens, GREEDY).result(60)
        m = engine.metrics()
    assert {e.finish_reason for e in errors} == {"error"}
    assert errors[0].error == "llama_decode returned -3 (fatal error)"
    assert second.finish_reason == "error" and "disk gone" in second.error
    assert ok.finish_reason == "length" and ok.completion_tokens == 16 and ok.cached_tokens == 0  # failed KV freed
    assert m["failed_steps"] == 2 and m["requests"]["by_reason"]["error"] == 3


def test_a_consumer_that_raises_loses_only_its_request(llm):
    def broken(ev):
        raise RuntimeError("consumer bug")

    with running(llm) as engine:
        tokens = engine.tokenize(PROMPT)
        bad = engine.submit(tokens, GREEDY, on_event=broken)
        good = engine.submit(tokens, GREEDY)
        assert bad.result(60).finish_reason == "cancelled"
        assert good.result(60).finish_reason == "length"


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


def test_an_engine_needs_the_sequences_it_runs(smollm2_path):
    llm = hypura.Llama(str(smollm2_path), n_ctx=N_CTX, verbose=False)  # n_seq_max 1
    try:
        with pytest.raises(HypuraError, match="holds 1 sequences, fewer than parallel 4"):
            Engine(llm, EngineConfig(parallel=4))
        with pytest.raises(HypuraError, match="step_tokens 1024 must lie within"):
            Engine(llm, EngineConfig(parallel=1, step_tokens=1024))
    finally:
        llm.close()


def test_a_streaming_error_ends_the_requests_of_its_step(tiny_llama, monkeypatch):
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from engine_invariance import streamed_dense
    from hypura.engine import load
    from hypura.runtime.transfers import Transfers

    def eio(fd, bufs, offset):
        raise OSError(errno.EIO, "Input/output error")

    llm, engine = load(tiny_llama, parallel=2, n_ctx_per_seq=128, plan=streamed_dense(tiny_llama), n_threads=1)
    monkeypatch.setattr(Transfers, "pread", staticmethod(eio))  # before the first read: the reader keeps it
    try:
        tokens = engine.tokenize(PROMPT)
        results = [r.result(60) for r in [engine.submit(tokens, GREEDY) for _ in range(2)]]
        assert {r.finish_reason for r in results} == {"error"}
        assert all("could not be streamed" in r.error and "Input/output error" in r.error for r in results)
        assert engine.metrics()["requests"]["active"] == 0
        # the engine is not left failed: the next request ends at once with the reason, and so on
        for _ in range(2):
            after = engine.submit(tokens, GREEDY).result(60)
            assert after.finish_reason == "error" and "could not be streamed" in after.error
        assert engine.metrics()["requests"]["active"] == 0
    finally:
        engine.close()
        llm.close()


def test_budgets_plan_for_the_batch_and_the_plan_sets_op_offload(tiny_llama):
    import dataclasses

    from hypura.modelfile import read_header
    from hypura.plan.decision import Ask, decide
    from hypura.profile import resolve_profile

    kwargs = engine_llama_kwargs(8, 64, ram="2GiB", gpu_mem="0")
    assert kwargs["ram"] == "2GiB" and kwargs["param_overrides"]["context_params"]["n_seq_max"] == 9  # + embeddings
    # hypura.Llama's decision for those keywords: a plan for steps of 8 tokens
    header, profile = read_header(tiny_llama), resolve_profile("h200-design")
    plan = decide(header, Ask(gpu_mem="0", ram="2GiB", n_ctx=8 * 64), None, profile, steps=(8,)).plan
    assert plan.prediction.parallel == plan.traffic.parallel == 8 and plan.n_ctx == 8 * 64
    assert decide(header, Ask(plan=plan), None, profile).context_params == ({} if plan.traffic.op_offload else
                                                                          {"op_offload": False})
    off = dataclasses.replace(plan, traffic=dataclasses.replace(plan.traffic, op_offload=False))
    assert decide(header, Ask(plan=off), None, profile).context_params == {"op_offload": False}
    # no budgets, no plan: no placement but every layer offered to the GPU, as a server (the default path fits it)
    plain = engine_llama_kwargs(8, 64)
    assert "plan" not in plain and "gpu_mem" not in plain
    assert plain["param_overrides"]["context_params"]["n_seq_max"] == 9  # a spare sequence id: embeddings
    assert plain["n_gpu_layers"] == -1 and engine_llama_kwargs(8, 64, n_gpu_layers=0)["n_gpu_layers"] == 0


def test_the_batched_argmax_picks_what_llama_cpps_greedy_sampler_picks(llm):
    """Plain greedy sequences take their token from one argmax over the step's logits: the first maximum,
    as llama.cpp's greedy scan; ties, infinities and NaN included (a NaN maximum goes to llama.cpp)."""
    import numpy as np

    from hypura.engine.sampler import Sampler, greedy_rows

    ctx, n = llm.ctx, 8
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    batch = llama_cpp.llama_batch_init(2 * n, 0, 1)
    try:
        for i in range(2 * n):  # every other token has logits: output row k is batch index 2k + 1
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = 100 + i, i // 4, 1
            batch.seq_id[i][0], batch.logits[i] = i % PARALLEL, i % 2
        batch.n_tokens = 2 * n
        assert llama_cpp.llama_decode(ctx, batch) == 0
        m = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(n, n_vocab))
        m[1, :] = 0.0  # all equal: the first
        m[2, [7, 300, n_vocab - 1]] = 1e9  # a three-way tie
        m[3, :] = -np.inf
        m[3, 5] = np.inf
        m[3, 9] = np.inf
        m[4, 0], m[4, 1:] = -0.0, 0.0  # -0.0 == 0.0: a tie, the first
        m[5, 0] = np.nan  # llama.cpp keeps index 0 when it is NaN
        m[6, 3] = np.nan  # and never picks a NaN after it
        samplers = [Sampler(GREEDY, n_vocab, N_CTX) for _ in range(n)]
        want = [s.sample(ctx, 2 * k + 1) for k, s in enumerate(samplers)]
        got = greedy_rows(ctx, n_vocab, n, list(range(n)))
        assert [g if g >= 0 else s.sample(ctx, 2 * k + 1) for k, (g, s) in enumerate(zip(got, samplers))] == want
        assert got[5] == got[6] == -1 and want[1] == 0 and want[2] == 7 and want[3] == 5 and want[4] == 0
        assert greedy_rows(ctx, n_vocab, n, [0, 2, 7]) == [want[0], want[2], want[7]]
        for s in samplers:
            s.close()
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)


@pytest.mark.slow
def test_greedy_and_sampled_sequences_in_one_step_each_give_what_they_give_alone(llm):
    """A step's plain greedy rows go through one argmax, the others through their llama.cpp chains."""
    tokens = llm.tokenize(PROMPT.encode())
    warm = SamplingParams(max_tokens=16, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)
    penalized = SamplingParams(max_tokens=16, temperature=0.0, repeat_penalty=1.3)
    kinds = (GREEDY, warm, penalized, GREEDY)
    with running(llm, prefix_cache=False) as engine:
        alone = [engine.submit(tokens, p).result(60).tokens for p in kinds]
        together = [engine.submit(tokens, p) for p in kinds]
        assert [r.result(60).tokens for r in together] == alone
    assert alone[0] == alone[3] and alone[1] != alone[0] and alone[2] != alone[0]


def test_a_grammar_constrains_its_sequence_only_even_greedy_and_penalized(llm):
    tokens = llm.tokenize(PROMPT.encode())
    yes_no = 'root ::= ("yes" | "no") " " [0-9] [0-9]'
    with running(llm) as engine:
        plain = engine.submit(tokens, SamplingParams(max_tokens=8, temperature=0.0))
        greedy = engine.submit(tokens, SamplingParams(max_tokens=8, temperature=0.0, grammar=yes_no))
        penalized = engine.submit(tokens, SamplingParams(max_tokens=8, temperature=1.0, repeat_penalty=1.3,
                                                         grammar=yes_no))  # the prompt is not fed to the grammar
        results = [r.result(60) for r in (plain, greedy, penalized)]
        with pytest.raises(HypuraError, match="grammar"):
            engine.submit(tokens, SamplingParams(grammar="root ::= ("))
        assert engine.submit(tokens, SamplingParams(max_tokens=2)).result(60).finish_reason == "length"
    assert results[0].text == engine_alone_text(llm, tokens)  # the greedy fast path beside a grammar's sequence
    for r in results[1:]:
        assert r.finish_reason == "stop" and r.text.split(" ")[0] in ("yes", "no") and r.text[-2:].isdigit()
    with pytest.raises(HypuraError, match="grammar"):
        SamplingParams(grammar=yes_no, ignore_eos=True)


def test_json_strings_admit_no_control_characters(llm):
    """The schema grammars' string character (llama.cpp's): after an opening quote, a newline is masked."""
    import ctypes

    from hypura.engine.sampler import grammar_sampler
    from hypura.serve.grammars import ANY_OBJECT, schema_rules

    assert r'[^"\\\x7F\x00-\x1F]' in schema_rules(ANY_OBJECT, "format")
    (quote,), (newline,), (letter,) = (llm.tokenize(t, add_bos=False) for t in (b'"', b"\n", b"a"))
    sampler = grammar_sampler(llm._model.vocab, schema_rules({"type": "string"}, "format"))
    try:
        llama_cpp.llama_sampler_accept(sampler, quote)
        data = (llama_cpp.llama_token_data * 2)(llama_cpp.llama_token_data(newline, 1.0, 0.0),
                                                llama_cpp.llama_token_data(letter, 1.0, 0.0))
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(llama_cpp.llama_token_data_array(data, 2, -1, False)))
    finally:
        llama_cpp.llama_sampler_free(sampler)
    assert data[0].logit == float("-inf") and data[1].logit == 1.0


def engine_alone_text(llm, tokens) -> str:
    with running(llm) as engine:
        return engine.submit(tokens, SamplingParams(max_tokens=8, temperature=0.0)).result(60).text


def test_logprobs_are_the_models_and_embeddings_use_the_spare_sequence(llm):
    import numpy as np

    tokens = llm.tokenize(PROMPT.encode())
    with running(llm) as engine:
        request = engine.submit(tokens, SamplingParams(max_tokens=4, temperature=0.0, logprobs=2))
        events = [e for e in request.events(60) if e.token is not None]
        vectors = engine.embed([tokens, tokens[:3], tokens])
        assert engine.submit(tokens, SamplingParams(max_tokens=2)).result(60).finish_reason == "length"
    for e in events:
        (best, best_lp), (_, second_lp) = e.logprob.top
        assert best == e.token and e.logprob.logprob == pytest.approx(best_lp) and second_lp <= best_lp <= 0
    assert vectors[0].shape == (llama_cpp.llama_model_n_embd(llm.model),) and np.allclose(vectors[0], vectors[2])
    assert not np.allclose(vectors[0], vectors[1])


def test_threads_batch_follows_threads():
    assert engine_llama_kwargs(2, 64, n_threads=1)["n_threads_batch"] == 1  # llama-server's -tb default
    assert engine_llama_kwargs(2, 64, n_threads=1, n_threads_batch=2)["n_threads_batch"] == 2
    assert "n_threads_batch" not in engine_llama_kwargs(2, 64)
