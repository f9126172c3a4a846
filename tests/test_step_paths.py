"""Per-step paths: one loaded model, each step's RAM layers streamed or computed in place as its size asks.

On the CPU there is no link to stream over, so the planner never makes such a table here; these tests give a
plan one by hand, the dual layers streamed through host-pool slots (a GPU plan streams them into GPU slots):
the mechanism (homes, slots reassigned, graphs rebuilt) is the same, and so are the logits, bitwise (SmolLM2's
Q4_1/Q8_0 are never repacked, and streamed or in place the CPU reads ggml's plain layout)."""

import dataclasses
import json

import numpy as np
import pytest

import hypura
from hypura.plan import PlanSettings, knobs, plan_model
from hypura.plan.plan import Plan
from hypura.profile import machine_profile
from hypura.profile.store import resolve_profile
from hypura.synth import writer

from conftest import logits_by_steps

N_LAYER = 30  # SmolLM2-135M


@pytest.fixture(scope="module")
def ram_plan(smollm2_path):
    return plan_model(smollm2_path, machine_profile(), ram="4GiB", settings=PlanSettings(n_ctx=256))


def with_paths(plan: Plan, layers, first_streamed: int, slots: int = 2) -> Plan:
    """`plan` whose RAM blocks in `layers` stream at steps of first_streamed tokens or more, in place below."""
    names = tuple(sorted(t.name for t in plan.tensors if t.layer in layers and t.tier == "ram"))
    table = ((first_streamed - 1, (), 0.0), (512, names, 0.0)) if first_streamed > 1 else ((512, names, 0.0),)
    return dataclasses.replace(plan, step_paths=table, staging_slots=slots)


def opened(path, plan, n_threads, n_batch=512):
    return hypura.Llama(str(path), plan=plan, n_ctx=256, n_batch=n_batch, logits_all=True, n_threads=n_threads,
                        verbose=False)


@pytest.fixture(scope="module")
def resident(smollm2_path, ram_plan, n_threads):
    """The plan without paths: the logits of the prompt in one batch and one token at a time."""
    llm = opened(smollm2_path, ram_plan, n_threads)
    try:
        return logits_by_steps(llm, 512), logits_by_steps(llm, 1)
    finally:
        llm.close()


@pytest.mark.slow
def test_each_step_takes_its_path_and_the_logits_stay_bitwise(smollm2_path, ram_plan, resident, n_threads):
    batch_ref, token_ref = resident
    plan = with_paths(ram_plan, range(0, N_LAYER, 2), first_streamed=8)
    llm = opened(smollm2_path, plan, n_threads)
    try:
        streamer = llm._runtime.streamer
        assert np.array_equal(logits_by_steps(llm, 512), batch_ref)  # a prompt batch: streamed through slots
        loads = llm.stats()["stream"]["loads"]
        assert loads >= N_LAYER // 2
        assert streamer.streamed == frozenset(plan.step_paths[-1][1])
        assert np.array_equal(logits_by_steps(llm, 1), token_ref)  # one token a step: computed in place
        assert llm.stats()["stream"]["loads"] == loads  # nothing streamed for them
        assert streamer.streamed == frozenset()
        assert np.array_equal(logits_by_steps(llm, 512), batch_ref)  # and back: graphs built anew each change
        assert streamer.path_changes == 3
    finally:
        llm.close()


@pytest.mark.slow
def test_every_step_streamed_gives_the_in_place_logits(smollm2_path, ram_plan, resident, n_threads):
    plan = with_paths(ram_plan, range(N_LAYER), first_streamed=1, slots=3)
    llm = opened(smollm2_path, plan, n_threads)
    try:
        assert np.array_equal(logits_by_steps(llm, 1), resident[1])
        assert llm.stats()["stream"]["loads"] >= N_LAYER
    finally:
        llm.close()


def test_greedy_text_is_the_same_on_either_path(smollm2_path, ram_plan, n_threads):
    def greedy(plan):
        llm = opened(smollm2_path, plan, n_threads)
        try:
            return llm.create_completion("The three laws of thermodynamics", max_tokens=12, temperature=0)["choices"][0]["text"]
        finally:
            llm.close()

    # the prompt streams (7+ tokens), each generated token is computed in place
    assert greedy(with_paths(ram_plan, range(N_LAYER), first_streamed=4)) == greedy(ram_plan)


@pytest.fixture(scope="module")
def gpu_plan(tmp_path_factory):
    """A llama3.3-70b shape (header only) planned for a GPU machine that holds a fifth of it, for 16 sequences:
    streaming predicts a clear gain there (plan/solve.py keeps llama.cpp's kind of placement within its error)."""
    path = tmp_path_factory.mktemp("paths") / "l70.gguf"
    writer.write_synth("llama3.3-70b", path, ftype="q4_k_m", sparse=True)
    plan = plan_model(path, resolve_profile("h200-design"), gpu_mem="8GiB", ram="64GiB",
                      settings=PlanSettings(n_ctx=4096, parallel=16))
    assert plan.why.startswith("streaming predicts")
    return plan


def test_the_planner_streams_more_layers_as_steps_grow(gpu_plan):
    steps = gpu_plan.step_paths
    # powers of two, and the largest step before op offload turns on: steps of 17..31 tokens take its path
    assert [k for k, _, _ in steps] == [1, 2, 4, 8, 16, knobs.OP_OFFLOAD_MIN_BATCH - 1, 32, 64, 128, 256, 512]
    # below op offload's batch more streams as the step grows; from it on, what does not stream is computed on the
    # GPU all the same, copied by op offload from its pinned home (plan/cost.py): every RAM block crosses the link
    small = [len(names) for k, names, _ in steps if k < knobs.OP_OFFLOAD_MIN_BATCH]
    assert small == sorted(small) and small[0] < small[-1]
    ram = {t.name for t in gpu_plan.tensors if t.tier == "ram" and t.name != "token_embd.weight"}
    assert gpu_plan.traffic.host_pinned and gpu_plan.traffic.op_offload
    assert set(steps[-1][1]) <= ram
    rates = [r for _, _, r in steps]
    assert rates == sorted(rates)  # aggregate tok/s grows with the step
    # each unit's compute at the plan's own step size is the table's
    for t in gpu_plan.tensors:
        if t.name in ram:
            assert t.compute == gpu_plan.compute_at(t, 16)
    # a prompt's micro-batch is the table's largest step, and its attention beside (on the GPU here: a few percent)
    assert 0.9 * steps[-1][2] < gpu_plan.prediction.prefill_tok_s < steps[-1][2]


def test_the_table_survives_a_plan_file(gpu_plan, tmp_path):
    again = Plan.load(gpu_plan.save(tmp_path / "plan.json"))
    assert again.step_paths == gpu_plan.step_paths
    assert json.loads(gpu_plan.to_json())["step_paths"][0][0] == 1


def test_speculation_starts_from_the_plans_pass_costs(gpu_plan):
    """A verification pass of n tokens is a step of n tokens: its cost is the plan's prediction for that step size
    until passes are measured; costs given beforehand (--spec-pass-ms) win."""
    from hypura.speculative.draft_length import PassTimes

    times = PassTimes.starting(None, gpu_plan)
    for k, _, rate in gpu_plan.step_paths:
        if k <= 64:
            assert times.predict(k) == pytest.approx(k / rate)
    assert times.predict(1) < times.predict(64)
    assert PassTimes.starting(((4, 250.0),), gpu_plan).predict(4) == pytest.approx(0.25)
    assert PassTimes.starting(None, None).by_tokens == {}
