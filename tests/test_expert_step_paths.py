"""Per-step paths for a MoE's experts: a layer's stacked expert tensors, every expert in RAM, streamed whole into
GPU pool slots at large steps and computed by the CPU where they are at small ones, as dense RAM layers are.

The planner's side on a fake GPU machine (the H200 example profile, header-only shapes); the mechanism's on the CPU,
as tests/test_step_paths.py does it for dense layers: a plan given its table by hand, the stacks dual through
host-pool slots, the logits bitwise equal to the stacks computed in place at every step size (repacking off on both
sides: a streamed tensor is always in ggml's plain layout)."""

import dataclasses

import numpy as np
import pytest

import hypura
from hypura.plan import PlanSettings, budgets_for, knobs, plan_model, rates_for
from hypura.plan.cost import GPU, RAM, Traffic, predict
from hypura.plan.plan import Plan
from hypura.plan.report import describe_steps
from hypura.plan.search import _optimize_candidates
from hypura.plan.solve import Solution, _Problem
from hypura.profile import machine_profile
from hypura.profile.store import resolve_profile
from hypura.runtime.dense.stream_layout import HOST_POOL, StreamLayout
from hypura.synth import writer
from hypura.units import model_units
from hypura.modelfile import read_header

from conftest import logits_by_steps

EXPS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
H200 = resolve_profile("h200-design")  # a 55 GB/s pinned link beside a 67 GB/s CPU


# --- the planner ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def q3_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("q3") / "q3.gguf"
    writer.write_synth("qwen3-30b-a3b", path, ftype="q4_k_m", sparse=True)
    return path


@pytest.fixture(scope="module")
def q3(q3_path):
    return model_units(read_header(q3_path))


def test_op_offloads_prompt_copies_add_to_the_compute_streamed_ones_overlap_it():
    """A micro-batch's time: op offload copies a weight and then computes it on the GPU's one stream; the layer
    streamer's copies run on a copy stream beside the compute."""
    r = rates_for(H200)
    flops, nbytes = r.gpu_flops * 0.1, r.link * 0.2  # 0.1 s of matmuls, 0.2 s of copies
    offloaded = predict(Traffic(n_ubatch=512, prefill_flops=flops, prefill_link_bytes=nbytes, prefill_on_gpu=True,
                                prefill_offload_bytes=nbytes, host_pinned=True), r)
    streamed = predict(Traffic(n_ubatch=512, prefill_flops=flops, prefill_link_bytes=nbytes, prefill_on_gpu=True), r)
    assert 512 / offloaded.prefill_tok_s == pytest.approx(0.3)
    assert 512 / streamed.prefill_tok_s == pytest.approx(0.2)
    assert offloaded.prefill_limit == streamed.prefill_limit == "link"


def test_op_offloads_step_copies_are_serial_with_the_compute_streamed_ones_overlap_and_the_link_carries_both():
    """A step of many tokens: op offload's copies on the compute stream add to it; streamed copies overlap it;
    both cross the one link; a step that mixes them loses knobs.COPY_CLASH of the shorter on both terms."""
    r = rates_for(H200)
    gpu_s, copy_s = 0.15, 0.2
    flops = r.gpu_flops * gpu_s * 64 / 63  # a step of 64 tokens: 63 of them at the matmul rate (batch_compute_s)

    def step(offload_share: float):
        t = Traffic(parallel=64, decode_gpu_flops=flops, offload_bytes=r.link * copy_s * offload_share,
                    link_bytes=r.link * copy_s * (1 - offload_share), host_pinned=True)
        return predict(t, r)

    offloaded, streamed, mixed = step(1.0), step(0.0), step(0.5)
    assert offloaded.seconds["offload"] == pytest.approx(copy_s)
    assert 64 / offloaded.decode_tok_s == pytest.approx(gpu_s + copy_s)  # one after the other
    assert 64 / streamed.decode_tok_s == pytest.approx(max(gpu_s, copy_s))  # overlapped: the link binds
    assert streamed.decode_limit == "link"
    clash = knobs.COPY_CLASH * copy_s / 2
    assert mixed.seconds["offload"] == pytest.approx(copy_s / 2 + clash)
    assert mixed.seconds["link"] == pytest.approx(copy_s + clash)  # the link carries both kinds of copies
    assert 64 / mixed.decode_tok_s == pytest.approx(gpu_s + copy_s / 2 + clash)
    assert 64 / mixed.decode_tok_s > 64 / streamed.decode_tok_s


def streaming_candidate(mu, gpu_mem: str, n_ubatch: int = 2048):
    """The best candidate that streams (the chosen plan may be llama.cpp's kind: decode weighs most in a chat
    turn), or None where none fits."""
    p = _Problem(mu, budgets_for(H200, gpu_mem, "64GiB"), rates_for(H200),
                 PlanSettings(n_ctx=4096, n_ubatch=n_ubatch, n_outputs=1))
    sols = [c for c in _optimize_candidates(p) if isinstance(c, Solution) and c.streams]
    return min(sols, key=lambda s: s.turn_s, default=None), p


def stacked_layers(mu, moved) -> set[int]:
    return {mu.units[i].stage for i in moved if mu.units[i].expert >= 0}


def test_a_prompts_micro_batch_streams_whole_expert_stacks_one_token_does_not(q3):
    sol, p = streaming_candidate(q3, "4GiB")
    steps = dict(sol.steps)
    assert not stacked_layers(q3, steps[1])  # one token: the CPU computes the routed experts where they are
    streamed = stacked_layers(q3, steps[2048])
    # where the slots fit, every layer whose experts are all in RAM: op offload's copies of the others would
    # share the link with the streamed ones (knobs.COPY_CLASH), and the streamed ones overlap the compute
    assert streamed == set(p.ram_stacks(sol.tiers))
    # a layer's stacks move as one: every expert of it, and only layers whose experts are all in RAM
    for layer in streamed:
        group = p.expert_groups[layer]
        assert set(group) <= set(steps[2048]) and all(sol.tiers[i] == RAM for i in group)
    # the slots hold a whole layer's stacks, and the GPU budget holds the slots
    stacks = max(sum(q3.units[i].nbytes for i in g) for g in p.expert_groups.values())
    assert sol.slot_bytes >= stacks
    assert sum(sol.memory[GPU].values()) <= p.b.gpu
    # the link carries the stacks whole; the copies overlap the GPU's compute, where op offload's add to it
    big = sol.at(2048)
    whole = sum(q3.units[i].nbytes for layer in streamed for i in p.expert_groups[layer])
    assert big.bytes_per_token["link"] == pytest.approx(whole)
    assert big.seconds["link"] >= big.seconds["gpu"] + big.seconds.get("offload", 0.0) - 1e-9
    assert 2048 / big.decode_tok_s == pytest.approx(max(big.seconds["link"], big.seconds["gpu"] + big.seconds["cpu"]
                                                        + big.seconds.get("offload", 0.0)
                                                        + big.seconds["overhead"]))


def test_streaming_stacks_beats_op_offloads_copies_at_a_large_micro_batch(q3):
    """Op offload copies each layer's experts and then computes them, on one stream; streamed, the next layer's
    stacks cross while the GPU computes: the same bytes, the compute hidden."""
    sol, p = streaming_candidate(q3, "4GiB")
    off = min((c for c in _optimize_candidates(p) if isinstance(c, Solution) and not c.streams
               and c.traffic.host_pinned and c.kv_tier == sol.kv_tier), key=lambda s: s.turn_s)
    assert sol.prediction.prefill_tok_s > off.prediction.prefill_tok_s * 1.1
    assert off.prediction.prefill_limit == "link"  # op offload's copies in its bound: a larger micro-batch pays


def test_no_stacks_stream_where_the_slots_do_not_fit(q3):
    """A GPU budget of about one layer's stacks beside the buffers: no slot for them, nothing of them streams."""
    sol, _ = streaming_candidate(q3, "1GiB")
    assert sol.steps and not any(stacked_layers(q3, moved) for _, moved in sol.steps)  # dense units stream still


def test_a_plan_for_16_sequences_streams_experts_and_inspect_says_from_which_step(q3_path):
    """q3 at 4 GiB for 16 sequences, prompts in micro-batches of 4096 (as `hypura inspect -np 16` grows them): the
    hybrid (some layers' stacks streamed while the CPU computes the others' routed experts) wins its aggregate
    decode, and a prompt's micro-batch streams stacks; one token streams none."""
    plan = plan_model(q3_path, H200, gpu_mem="4GiB", ram="64GiB",
                      settings=PlanSettings(n_ctx=4096, parallel=16, n_ubatch=4096, n_outputs=16))
    assert plan.pool_slots and plan.why.startswith("streaming predicts")
    stacks = {t.name for t in plan.tensors if t.experts}
    assert not set(plan.streamed_at(1)) & stacks
    assert set(plan.streamed_at(plan.n_ubatch)) & stacks
    text = "\n".join(describe_steps(plan))
    assert "expert layers streamed" in text
    first = next(k for k, names, _ in plan.step_paths if set(names) & stacks)
    assert f"experts streamed from {_smallest(plan, first)} tokens" in text


def _smallest(plan: Plan, k: int) -> int:
    sizes = [size for size, _, _ in plan.step_paths]
    return sizes[sizes.index(k) - 1] + 1 if sizes.index(k) else 1


# --- the mechanism (CPU) ------------------------------------------------------------------------

PLAIN = {"model_params": {"use_extra_bufts": False}}  # --no-repack: the in-place side in ggml's plain layout too


@pytest.fixture(scope="module")
def moe_plan(tiny_qwen3moe):
    return plan_model(tiny_qwen3moe, machine_profile(), ram="4GiB", settings=PlanSettings(n_ctx=256))


def with_stacks(plan: Plan, first_streamed: int, slots: int = 2) -> Plan:
    """`plan` whose layers' expert stacks stream at steps of first_streamed tokens or more, in place below."""
    names = tuple(sorted(t.name for t in plan.tensors if t.experts and t.tier == RAM))
    table = ((first_streamed - 1, (), 0.0), (512, names, 0.0)) if first_streamed > 1 else ((512, names, 0.0),)
    return dataclasses.replace(plan, step_paths=table, staging_slots=slots)


def opened(path, plan, n_threads):
    return hypura.Llama(str(path), plan=plan, n_ctx=256, n_batch=512, logits_all=True, n_threads=n_threads,
                        verbose=False, param_overrides=PLAIN)


@pytest.fixture(scope="module")
def in_place(tiny_qwen3moe, moe_plan, n_threads):
    llm = opened(tiny_qwen3moe, moe_plan, n_threads)
    try:
        return {k: logits_by_steps(llm, k) for k in (1, 4, 512)}
    finally:
        llm.close()


def test_the_stacks_are_dual(moe_plan):
    plan = with_stacks(moe_plan, first_streamed=8)
    layout = StreamLayout.of(plan, gpu=False)
    stacks = {t.name for t in plan.tensors if t.experts}
    assert stacks and all(name.split(".")[2] in EXPS for name in stacks)
    assert {n for n, s in layout.tensors.items() if s.dual} == stacks
    assert all(s.pool == HOST_POOL and s.source == RAM for s in layout.tensors.values())
    assert plan.compute_at(plan.placement(sorted(stacks)[0]), 1) == "cpu"
    assert plan.compute_at(plan.placement(sorted(stacks)[0]), 64) == "gpu"


@pytest.mark.slow
def test_each_step_size_takes_its_path_and_the_logits_stay_bitwise(tiny_qwen3moe, moe_plan, in_place, n_threads):
    plan = with_stacks(moe_plan, first_streamed=8)
    n_layer = moe_plan.n_layer
    llm = opened(tiny_qwen3moe, plan, n_threads)
    try:
        streamer = llm._runtime.streamer
        assert np.array_equal(logits_by_steps(llm, 512), in_place[512])  # a prompt batch: stacks through slots
        loads = llm.stats()["stream"]["loads"]
        assert loads >= n_layer
        assert streamer.streamed == frozenset(plan.step_paths[-1][1])
        for k in (1, 4):  # small steps: the stacks computed in place, from their pinned home
            assert np.array_equal(logits_by_steps(llm, k), in_place[k])
        assert llm.stats()["stream"]["loads"] == loads
        assert streamer.streamed == frozenset()
        assert np.array_equal(logits_by_steps(llm, 512), in_place[512])
        assert streamer.path_changes == 3
    finally:
        llm.close()


@pytest.mark.slow
def test_every_step_streamed_gives_the_in_place_logits(tiny_qwen3moe, moe_plan, in_place, n_threads):
    llm = opened(tiny_qwen3moe, with_stacks(moe_plan, first_streamed=1), n_threads)
    try:
        for k in (1, 4):
            assert np.array_equal(logits_by_steps(llm, k), in_place[k])
    finally:
        llm.close()


def test_greedy_text_is_the_same_on_either_path(tiny_qwen3moe, moe_plan, n_threads):
    def greedy(plan):
        llm = hypura.Llama(str(tiny_qwen3moe), plan=plan, n_ctx=256, n_threads=n_threads, verbose=False,
                           param_overrides=PLAIN)
        try:
            return llm.create_completion("The three laws of thermodynamics", max_tokens=12,
                                         temperature=0)["choices"][0]["text"]
        finally:
            llm.close()

    # the prompt streams its stacks (4+ tokens), each generated token computes them in place
    assert greedy(with_stacks(moe_plan, first_streamed=4)) == greedy(moe_plan)
