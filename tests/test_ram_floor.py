"""The RAM floor: staging for disk streaming is bounded by the read-ahead (a few layers or experts, never the
whole model), the smallest --ram that plans a model is found and said, and budgets near it plan and run."""

from __future__ import annotations

import re

import pytest

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan import PlanSettings, budgets_for, model_units, plan_model, rates_for
from hypura.plan import knobs
from hypura.plan.search import ram_floor
from hypura.plan.solve import _Problem
from hypura.plan.staging import staging_reserves
from hypura.profile import machine_profile
from hypura.sizes import fmt_mib, parse_size
from hypura.synth import writer

CTX = 4096
# the two shapes issue 41 names: each ran under this budget before its staging grew to the whole model
SHAPES = {"llama3.1-8b": ("q4_k_m", "1600MiB"), "mixtral-8x7b": ("q5_k_m", "1280MiB")}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shape(request, tmp_path_factory):
    name = request.param
    ftype, budget = SHAPES[name]
    layers = 4 if name == "llama3.1-8b" else 2
    path = tmp_path_factory.mktemp("floor") / f"{name}.gguf"
    writer.write_synth(name, path, layers=layers, ftype=ftype, sparse=True)  # header only: planned, not run
    return read_header(path), budget


def _parts(header, n_ubatch: int = knobs.N_UBATCH):
    """(the RAM every plan holds beside its weights and staging, the largest staging one slot needs) on the CPU, at
    a micro-batch."""
    profile = machine_profile()
    p = _Problem(model_units(header), budgets_for(profile, 0, "1GiB"), rates_for(profile),
                 PlanSettings(n_ctx=CTX, n_ubatch=n_ubatch))
    fixed = p.host_only + p.kv + p.cpu_buf + knobs.PROCESS_RAM
    return fixed, max(staging_reserves(p, 1))


def _staging_split(plan):
    """(the host pool's slots for dense disk layers, the pager's share) of a CPU plan's staging
    (staging.staging_slots)."""
    dense = {}
    for t in plan.tensors:
        if t.tier == "disk" and not (t.experts and "disk" in t.experts):
            dense[t.layer] = dense.get(t.layer, 0) + t.nbytes
    host = min(plan.staging_slots, len(dense)) * max(dense.values(), default=0)
    return host, plan.memory["ram"]["staging"] - host


def test_a_streamed_plan_stages_no_more_than_its_read_ahead(shape):
    header, budget = shape
    plan = plan_model(header, machine_profile(), gpu_mem=0, ram=budget, settings=PlanSettings(n_ctx=CTX))
    fixed, largest = _parts(header, plan.n_ubatch)
    staging = plan.memory["ram"]["staging"]
    assert plan.memory["disk"]["weights"] > 0 and staging > 0  # streamed from disk
    # the bound: at most prefetch depth + 1 slots, each no larger than the largest stage; here fewer than that
    assert 1 <= plan.staging_slots <= plan.prefetch_depth + 1
    host, pager = _staging_split(plan)
    if pager:  # paged experts: the host pool's slots beside the experts one micro-batch selects of a layer
        k = header.get("expert_used_count")
        expert = max(t.nbytes // len(t.experts) for t in plan.tensors if t.experts) * 3  # a layer's three stacks
        assert pager <= min(header.get("expert_count"), plan.n_ubatch * k) * expert
    else:
        assert staging == plan.staging_slots * plan.staging_slot_bytes and plan.staging_slot_bytes <= largest
    assert staging < sum(t.nbytes for t in header.tensors) / 2  # not the whole model


def test_the_floor_is_the_fixed_part_and_one_stage(shape):
    header, _ = shape
    profile = machine_profile()
    settings = PlanSettings(n_ctx=CTX)
    floor = ram_floor(model_units(header), budgets_for(profile, 0, "1GiB"), rates_for(profile), settings)
    fixed, largest = _parts(header, plan_model(header, profile, gpu_mem=0, ram=floor, settings=settings).n_ubatch)
    # what every plan holds, then one staging slot of the largest stage: the stated bound (to the search's step)
    assert fixed < floor <= fixed + largest + (16 << 20)
    plan = plan_model(header, profile, gpu_mem=0, ram=floor, settings=settings)
    assert plan.memory["ram"]["staging"] > 0
    with pytest.raises(HypuraError, match=f"at least {fmt_mib(floor)} ") as e:
        plan_model(header, profile, gpu_mem=0, ram=floor - (16 << 20), settings=settings)
    assert parse_size(fmt_mib(floor)) >= floor and "the smallest --ram" in str(e.value)


@pytest.mark.slow
def test_the_small_model_runs_under_the_old_budget(tmp_path, n_threads):
    """issue 41's 4-layer llama3.1-8b shape, real weights, a few tokens under --ram 1600MiB."""
    import hypura

    path = tmp_path / "l8x4.gguf"
    writer.write_synth("llama3.1-8b", path, layers=4)
    llm = hypura.Llama(str(path), ram="1600MiB", n_ctx=CTX, n_threads=n_threads, verbose=False)
    try:
        assert llm.plan.memory["disk"]["weights"] > 0
        out = llm.create_completion("Once upon a time", max_tokens=3, temperature=0.0)
        assert out["usage"]["completion_tokens"] >= 1
        assert llm.plan.used("ram") <= parse_size("1600MiB")
    finally:
        llm.close()


def test_a_tied_model_decodes_at_its_floor(gemma_path, n_threads):
    """Gemma-3's output matrix is its token_embd (tied): one tensor that the graph's first node (the input rows) and
    its last read, so it cannot share a stream slot with a layer. At the smallest --ram that plans it, it stays in
    RAM while the layers stream, and the greedy text is that of an unbudgeted run in ggml's plain layout."""
    import hypura
    from greedy import COUNTING, assert_same_tokens, greedy

    small = dict(n_ctx=64, n_batch=64, n_ubatch=64, n_threads=n_threads, verbose=False)
    with pytest.raises(HypuraError, match="the smallest --ram") as e:
        hypura.Llama(str(gemma_path), ram="64MiB", **small)
    floor = re.search(r"at least (\S+) ", str(e.value)).group(1)
    plain = hypura.Llama(str(gemma_path), fit=False, param_overrides={"model_params": {"use_extra_bufts": False}},
                         **small)
    try:
        prompt = plain.tokenize(COUNTING.encode())
        want = greedy(plain, prompt, 6)
    finally:
        plain.close()
    llm = hypura.Llama(str(gemma_path), ram=floor, **small)
    try:
        assert_same_tokens(greedy(llm, prompt, 6).tokens, want, at_least=6)
        assert llm.plan.memory["disk"]["weights"] > 0 and llm.plan.placement("token_embd.weight").tier == "ram"
    finally:
        llm.close()


def test_inspect_says_the_floor_and_a_budget_below_it_fails_with_it(shape, tmp_path):
    from click.testing import CliRunner

    from hypura.cli.inspect_cmd import inspect

    header, budget = shape
    ok = CliRunner().invoke(inspect, [str(header.path), "--gpu-mem", "0", "--ram", budget, "-c", str(CTX)])
    assert ok.exit_code == 0, ok.output
    floor = next(line for line in ok.output.splitlines() if line.startswith("floor    --ram "))
    size = floor.split()[2].rstrip(":")
    assert parse_size(size) < parse_size(budget)
    short = CliRunner().invoke(inspect, [str(header.path), "--gpu-mem", "0", "--ram", f"{(parse_size(size) >> 20) - 32}MiB",
                                         "-c", str(CTX)])
    assert short.exit_code != 0 and f"ram needs at least {size} " in str(short.exception)
    assert CliRunner().invoke(inspect, [str(header.path), "--gpu-mem", "0", "--ram", size, "-c", str(CTX)]).exit_code == 0
