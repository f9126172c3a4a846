"""The CPU at a decode step of several tokens: the profile times one on the model's blocks beside the one-token
steps and the prompt, and says how much faster it ran than the cost model's sum (the step's bytes at the one-token
rate, its further tokens at the prefill rate); the cost model divides its CPU term at such steps by that gain.
Timings here are made up: what is tested is the arithmetic from them."""

import dataclasses
import json

import pytest

from hypura.modelfile import read_header
from hypura.plan.cost import CPU, Rates, batch_compute_s, decode_seconds
from hypura.profile import compute, measure_knobs as knobs, store
from hypura.profile.machine import CpuCompute
from hypura.synth import writer

BLOCK_BW, FLOPS = 10e9, 100e9  # the made-up machine: its blocks' one-token rate and its prefill rate


@pytest.fixture(scope="module")
def moe_header(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "tiny-qwen3moe.gguf"
    writer.write_synth("tiny-qwen3moe", path, sparse=True)
    return read_header(path)


def model_s(header, blocks: int, tokens: int) -> float:
    """The cost model's time for a step of `tokens` tokens over the first `blocks` blocks on the made-up machine."""
    nbytes, weights = compute.token_load(header, blocks, tokens)
    return batch_compute_s(nbytes, 2.0 * tokens * weights, BLOCK_BW, FLOPS, tokens)


def test_the_profile_says_how_much_faster_a_batched_step_ran_than_the_cost_models_sum(moe_header):
    base, top = compute.block_counts(moe_header)
    assert base < top
    k, prompt = knobs.LLAMA_BATCH_TOKENS, knobs.LLAMA_PROMPT_TOKENS

    def times(n: int):
        nbytes, weights = compute.token_load(moe_header, n)
        # one token at the blocks' rate, the prompt at the prefill rate, the batched step in half the model's time
        return (nbytes / BLOCK_BW, nbytes / BLOCK_BW, 2.0 * prompt * weights / FLOPS, model_s(moe_header, n, k) / 2)

    cpu = compute._rates(moe_header, "tiny", 2, base, top, {base: times(base), top: times(top)})
    assert cpu.prefill_flops == pytest.approx(FLOPS)
    (k8, g8), (k32, g32) = cpu.batch_gain
    assert (k8, k32) == (k, prompt)
    assert g8 == pytest.approx(2.0)
    # the prompt ran as its FLOPs at the prefill rate say, where the sum adds its bytes at the one-token rate
    (tb, tw), (bb, bw) = compute.token_load(moe_header, top, prompt), compute.token_load(moe_header, base, prompt)
    took = 2.0 * prompt * (tw - bw) / FLOPS
    assert g32 == pytest.approx((model_s(moe_header, top, prompt) - model_s(moe_header, base, prompt)) / took)
    assert g32 > 1.0
    assert "8-token step in 0.50 of the time the cost model sums" in cpu.method


def test_an_experts_bytes_at_a_step_count_once_whichever_tokens_select_it(moe_header):
    one, _ = compute.token_load(moe_header, 1)
    eight, _ = compute.token_load(moe_header, 1, 8)
    assert one < eight < 8 * one  # 8 tokens select more of a layer's experts than one, some the same ones


def test_the_cpus_gain_is_one_at_a_token_measured_at_its_steps_and_fades_past_the_prompt():
    r = Rates(cpu_read=50e9, disk_read=1e9, cpu_batch_gain=((8, 1.6), (32, 1.8)))
    assert r.cpu_gain(1) == 1.0
    assert r.cpu_gain(8) == pytest.approx(1.6) and r.cpu_gain(32) == pytest.approx(1.8)
    assert 1.0 < r.cpu_gain(4) < 1.6 and 1.6 < r.cpu_gain(16) < 1.8
    assert r.cpu_gain(4) == pytest.approx(1.6 ** (2 / 3))  # log-linear in the tokens
    # past the prompt the bytes the sum counts twice stay and the FLOPs grow: a 2048-token step gains 1/64 of it
    assert r.cpu_gain(2048) == pytest.approx(1.0 + 0.8 / 64)
    assert Rates(cpu_read=50e9, disk_read=1e9).cpu_gain(16) == 1.0  # none measured: the sum as it was


def test_the_cost_models_cpu_term_at_a_step_is_its_sum_over_the_gain():
    plain = Rates(cpu_read=50e9, disk_read=1e9, cpu_flops=400e9)
    gained = dataclasses.replace(plain, cpu_batch_gain=((8, 2.0),))

    def cpu_s(r: Rates, tokens: int) -> float:
        return decode_seconds(0.0, 0.0, 1e9, tokens * 6e9, 0.0, 0.0, 0.0, 0.0, r, tokens)[CPU]

    assert cpu_s(gained, 1) == cpu_s(plain, 1)  # one token: the measured rate
    assert cpu_s(gained, 8) == pytest.approx(cpu_s(plain, 8) / 2.0)


def test_cpu_rates_with_their_gains_round_trip_and_an_older_file_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu = CpuCompute(50e9, 400e9, 16, "made up", batch_gain=((8, 1.5), (32, 1.7)))
    store.save_model_cpu("key", "mix", cpu)
    assert store.load_model_cpu("key", "mix") == cpu  # tuples again from the JSON's lists
    path = store.cpu_cache_path("key", "mix")
    older = {k: v for k, v in json.loads(path.read_text()).items() if k != "batch_gain"}
    path.write_text(json.dumps(older))
    assert store.load_model_cpu("key", "mix") is None


def test_the_gpus_prompt_rate_is_the_extra_blocks_flops_over_the_time_they_add(monkeypatch):
    from hypura.profile.gpu_compute import prompt_flops

    monkeypatch.setattr(knobs, "GPU_PROMPT_TOKENS", 1000)
    # 2 blocks more: 3e8 weights a token more, 6 ms more for 1000 tokens -> 2 * 3e8 * 1000 / 0.006
    assert prompt_flops({1: 1e8, 3: 4e8}, {1: 0.004, 3: 0.010}) == pytest.approx(1e14)
    assert prompt_flops({1: 1e8, 3: 4e8}, {1: 0.010, 3: 0.009}) is None  # noise larger than the blocks: no rate
    assert prompt_flops({2: 2e8}, {2: 0.004}) == pytest.approx(1e14)  # one slice: its own time


def test_the_models_gpu_prompt_rate_replaces_the_machines_default():
    from hypura.plan.budget import rates_for
    from hypura.profile.store import resolve_profile

    prof = resolve_profile("h200-design")
    assert rates_for(prof).gpu_flops == prof.gpu.prefill_flops
    timed = dataclasses.replace(prof, cpu=dataclasses.replace(prof.cpu, gpu_prefill_flops=8e13))
    assert rates_for(timed).gpu_flops == 8e13
