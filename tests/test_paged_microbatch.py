"""A CPU plan that pages experts from disk runs within its RAM budget, prompts included (plan/microbatch.py): the
staging holds every expert one micro-batch may select of a layer, as the runtime lays it out (the host pool's slots
for dense disk layers, the rest the pager's), and the micro-batch is chosen so."""

from __future__ import annotations

import pytest

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan import PlanSettings, budgets_for, model_units, plan_model, rates_for
from hypura.plan.ask import Ask
from hypura.plan.load_params import Host, load_params
from hypura.plan.microbatch import paged_choices
from hypura.plan.pools import HOST_POOL, paged_by_expert
from hypura.plan.search import ram_floor
from hypura.profile import machine_profile
from hypura.runtime.dense.stream_layout import StreamLayout
from hypura.sizes import fmt_mib
from hypura.synth import writer

CTX = 4096


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    """The Mixtral subset of bench/RESULTS.md ram-floor-cpu: 2 layers of 8 experts (123 MiB each), k = 2."""
    path = tmp_path_factory.mktemp("paged") / "mx2.gguf"
    writer.write_synth("mixtral-8x7b", path, layers=2, ftype="q5_k_m", sparse=True)  # header only: planned, not run
    return read_header(path)


def _floor(header) -> int:
    profile = machine_profile()
    return ram_floor(model_units(header), budgets_for(profile, 0, "1GiB"), rates_for(profile), PlanSettings(n_ctx=CTX))


def _largest_call(plan, k: int) -> int:
    """The bytes of the experts one micro-batch may select of a layer, kept resident together by the pager: the
    largest min(disk experts, n_ubatch x k) of the layer, over its stacked tensors."""
    per_expert: dict[int, list[int]] = {}
    for t in plan.tensors:
        if paged_by_expert(t):
            sizes = per_expert.setdefault(t.layer, [0] * len(t.experts))
            for e, tier in enumerate(t.experts):
                sizes[e] += t.nbytes // len(t.experts) if tier == "disk" else 0
    calls = [sum(sorted(s, reverse=True)[:plan.n_ubatch * k]) for s in per_expert.values()]
    return max(calls, default=0)


def test_the_micro_batches_tried_stage_fewer_experts_than_a_layer_holds():
    assert paged_choices(512, 8, 2, 1) == [512, 2, 1]  # 4 x 2 selects all 8, as 512 does
    assert paged_choices(512, 128, 8, 1) == [512, 8, 4, 2, 1]
    assert paged_choices(512, 128, 8, 4) == [512, 8, 4]  # a decode step of 4 sequences is not split
    assert paged_choices(1, 8, 2, 1) == [1]


@pytest.mark.parametrize("ram", ["floor", "764MiB", "1280MiB", "2GiB"])
def test_one_micro_batchs_experts_fit_the_pagers_share_of_the_staging(mixtral, ram):
    budget = _floor(mixtral) if ram == "floor" else ram
    plan = plan_model(mixtral, machine_profile(), gpu_mem=0, ram=budget, settings=PlanSettings(n_ctx=CTX))
    assert any(paged_by_expert(t) for t in plan.tensors)  # experts page from disk at each of these budgets
    # the pager's budget as the runtime sets it (runtime.py): the staging less the host pool's slots
    pager = plan.memory["ram"]["staging"] - StreamLayout.of(plan, gpu=False).pool_bytes(HOST_POOL)
    assert 0 < _largest_call(plan, mixtral.get("expert_used_count")) <= pager
    assert plan.used("ram") <= plan.memory["ram"]["budget"]


def test_at_the_old_floor_the_prompt_takes_a_smaller_micro_batch(mixtral):
    """At 764 MiB a prompt's micro-batch of 512 selects all 8 experts of a layer (985 MiB): the plan takes one
    whose selections the staging holds; with room for every expert in RAM, llama.cpp's 512 stands."""
    small = plan_model(mixtral, machine_profile(), gpu_mem=0, ram="764MiB", settings=PlanSettings(n_ctx=CTX))
    assert small.n_ubatch * 2 < 8
    whole = plan_model(mixtral, machine_profile(), gpu_mem=0, ram="3GiB", settings=PlanSettings(n_ctx=CTX))
    assert whole.n_ubatch == 512 and not any(paged_by_expert(t) for t in whole.tensors)


def test_the_floor_is_said_at_the_smallest_micro_batch(mixtral):
    floor = _floor(mixtral)
    plan_model(mixtral, machine_profile(), gpu_mem=0, ram=floor, settings=PlanSettings(n_ctx=CTX))
    with pytest.raises(HypuraError, match=f"at least {fmt_mib(floor)} "):
        plan_model(mixtral, machine_profile(), gpu_mem=0, ram=floor - (16 << 20), settings=PlanSettings(n_ctx=CTX))


def test_the_load_hands_llama_cpp_the_chosen_micro_batch(mixtral):
    plan = plan_model(mixtral, machine_profile(), gpu_mem=0, ram="764MiB", settings=PlanSettings(n_ctx=CTX))
    params = load_params(plan, CTX, Ask(n_outputs=1), Host(gpu=False, cores=2, cpus=2))
    assert params.n_ubatch == plan.n_ubatch < 512 and params.plan_batch
    assert params.fields()["context_params"]["n_ubatch"] == plan.n_ubatch
    assert "n_outputs_max" not in params.fields()["context_params"]  # a smaller micro-batch limits no outputs


def test_a_prompt_at_the_floor_keeps_its_experts_within_the_plans_staging(tiny_qwen3moe, monkeypatch):
    """The tiny MoE (16 experts, top-4) at its RAM floor: every expert on disk, a micro-batch of 1; a prompt of many
    tokens runs in micro-batches whose experts the pager's share holds (before, a prompt's 512 selected all 16)."""
    import hypura
    from hypura.runtime.moe import expert_paging

    monkeypatch.setattr(expert_paging, "RSS_MARGIN", 1 << 50)  # the plan's share only, not grown into free RAM
    header = read_header(tiny_qwen3moe)
    profile = machine_profile()
    floor = ram_floor(model_units(header), budgets_for(profile, 0, "1GiB"), rates_for(profile), PlanSettings(n_ctx=256))
    llm = hypura.Llama(str(tiny_qwen3moe), ram=floor, n_ctx=256, n_threads=1, verbose=False)
    try:
        plan, pager = llm.plan, llm._pager
        assert pager is not None and plan.n_ubatch < 4  # 4 tokens' top-4 would select all 16
        assert llm.context_params.n_ubatch == plan.n_ubatch  # what the plan staged for is what llama.cpp runs
        llm.create_completion("The quick brown fox jumps over the lazy dog. " * 3, max_tokens=2, temperature=0.0)
        assert pager.stats.loads > 0
        assert 0 < pager.stats.resident_peak <= pager.budget == pager.base_budget
        assert pager.base_budget <= plan.memory["ram"]["staging"]
    finally:
        llm.close()
