"""The batched engine's queue, close, errors and set-up on SmolLM2-135M (and a tiny streamed model): what
fails ends only what it touches, close ends what runs and waits."""

import contextlib
import errno
import os
import time

import pytest

import hypura
from hypura.engine import Engine, EngineClosed, EngineConfig, QueueFull, SamplingParams, engine_llama_kwargs
from hypura.errors import HypuraError

from engine_helpers import N_CTX, GREEDY, PROMPT, running, engine_llm


@pytest.fixture(scope="module")
def llm(smollm2_path, n_threads):
    yield from engine_llm(smollm2_path, n_threads)


def test_a_full_queue_is_refused_and_close_ends_what_waits(llm):
    engine = Engine(llm.loaded, EngineConfig(parallel=1, max_queue=2))  # not started: everything waits
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
    engine = Engine(llm.loaded, EngineConfig(parallel=2)).start()
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
    real, calls = llm.loaded.decode_batch, []

    def failing(batch, decode=False):
        calls.append(batch.n_tokens)
        if len(calls) == 1:
            return -3
        if len(calls) == 2:
            raise HypuraError("weights could not be streamed, the results are void: disk gone")
        return real(batch, decode)

    monkeypatch.setattr(llm.loaded, "decode_batch", failing)
    engine = Engine(llm.loaded)
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


def test_an_engine_needs_the_sequences_it_runs(smollm2_path):
    llm = hypura.Llama(str(smollm2_path), n_ctx=N_CTX, verbose=False)  # n_seq_max 1
    try:
        with pytest.raises(HypuraError, match="holds 1 sequences, fewer than parallel 4"):
            Engine(llm.loaded, EngineConfig(parallel=4))
        with pytest.raises(HypuraError, match="step_tokens 1024 must lie within"):
            Engine(llm.loaded, EngineConfig(parallel=1, step_tokens=1024))
    finally:
        llm.close()


def test_building_an_engine_loads_no_draft_model(llm, smollm2_path, monkeypatch):
    """The loader loads a draft-simple engine's draft (engine/loader.py load_draft); the engine only takes it."""
    from hypura.loaded import drafts
    from hypura.speculative.settings import SpecSettings

    monkeypatch.setattr(drafts, "load", lambda *a, **k: pytest.fail("the engine loaded a model"))
    spec = SpecSettings(type="draft-simple", draft_model=smollm2_path)
    with pytest.raises(HypuraError, match="hypura.engine.load loads it"):
        Engine(llm.loaded, EngineConfig(parallel=2, speculative=spec))
    with pytest.raises(HypuraError, match="does not speculate"):
        Engine(llm.loaded, EngineConfig(parallel=2), draft=object())


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
    from hypura.plan.load_params import Host
    from hypura.profile import resolve_profile

    kwargs = engine_llama_kwargs(8, 64, ram="2GiB", gpu_mem="0")
    assert kwargs["ram"] == "2GiB" and (kwargs["parallel"], kwargs["spare_seqs"]) == (8, 1)  # + embeddings
    # hypura.Llama's decision for those keywords: a plan for steps of 8 tokens, 9 sequence ids in one KV cache
    header, profile, machine = read_header(tiny_llama), resolve_profile("h200-design"), Host(False, 4, 8)
    ask = Ask(gpu_mem="0", ram="2GiB", n_ctx=8 * 64, parallel=8, spare_seqs=1)
    planned = decide(header, ask, None, profile, host=machine)
    plan = planned.plan
    assert plan.prediction.parallel == plan.traffic.parallel == 8 and plan.n_ctx == 8 * 64
    assert planned.params.n_seq_max == 9 and planned.params.kv_unified
    assert decide(header, Ask(plan=plan), None, profile, host=machine).params.op_offload == (
        None if plan.traffic.op_offload else False)
    off = dataclasses.replace(plan, traffic=dataclasses.replace(plan.traffic, op_offload=False))
    assert decide(header, Ask(plan=off), None, profile, host=machine).params.op_offload is False
    # no budgets, no plan: no placement but every layer offered to the GPU, as a server (the default path fits it)
    plain = engine_llama_kwargs(8, 64)
    assert "plan" not in plain and "gpu_mem" not in plain and plain["spare_seqs"] == 1  # a spare id: embeddings
    assert plain["n_gpu_layers"] == -1 and engine_llama_kwargs(8, 64, n_gpu_layers=0)["n_gpu_layers"] == 0
