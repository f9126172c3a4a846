"""Plans applied through the loader hook (CPU build): same logits as llama.cpp's own placement."""

import numpy as np
import pytest

import hypura
from hypura.errors import HypuraError
from hypura.plan import PlanSettings, plan_model
from hypura.profile import machine_profile, resolve_profile
from hypura.runtime.placement import Tier

import llama_cpp



@pytest.fixture(scope="module")
def reference(smollm2_path, n_threads, prompt_logits):
    llm = llama_cpp.Llama(str(smollm2_path), n_ctx=256, logits_all=True, n_threads=n_threads, verbose=False)
    yield prompt_logits(llm)
    llm.close()


@pytest.mark.slow
def test_ram_plan_gives_the_same_logits(smollm2_path, reference, n_threads, tmp_path, prompt_logits):
    plan = plan_model(smollm2_path, machine_profile(), ram="4GiB", settings=PlanSettings(n_ctx=256))
    assert {t.tier for t in plan.tensors} == {"ram"} and plan.mode == "full-resident"
    path = plan.save(tmp_path / "plan.json")  # as `hypura inspect --json` writes it
    llm = hypura.Llama(str(smollm2_path), plan=str(path), n_ctx=256, logits_all=True, n_threads=n_threads,
                       verbose=False)
    try:
        assert llm.plan == plan
        assert {p.tier for p in llm.placement.values()} == {Tier.HOST}
        assert np.array_equal(prompt_logits(llm), reference)
    finally:
        llm.close()


@pytest.mark.slow
@pytest.mark.parametrize("ram,streams", [("2GiB", False), ("250MiB", True)])
def test_budgets_plan_automatically(smollm2_path, reference, n_threads, prompt_logits, ram, streams):
    llm = hypura.Llama(str(smollm2_path), ram=ram, n_ctx=256, logits_all=True, n_threads=n_threads,
                       verbose=False)
    try:
        assert (llm.plan.mode == "full-resident") != streams
        assert (llm.plan.tensors_by_tier()["disk"] > 0) == streams  # this budget streams from disk
        assert any(p.pool_slot >= 0 for p in llm.placement.values()) == streams
        assert np.array_equal(prompt_logits(llm), reference)
        if streams:
            stats = llm.stats()
            assert stats["stream"]["bytes"]["disk"] > 0
            assert stats["prefill"]["last_call_splits_ms"][0][1] == "CPU"  # the split profile: one CPU graph
    finally:
        llm.close()


def test_gpu_plan_on_a_cpu_build_is_refused(smollm2_path):
    plan = plan_model(smollm2_path, resolve_profile("h200-design"), settings=PlanSettings(n_ctx=256))
    assert {t.tier for t in plan.tensors} == {"gpu"}
    with pytest.raises(HypuraError, match="this llama.cpp build has none"):
        hypura.Llama(str(smollm2_path), plan=plan, n_ctx=256, verbose=False)


def test_plan_for_another_model_is_refused(smollm2_path, gemma_path):
    plan = plan_model(gemma_path, machine_profile(), settings=PlanSettings(n_ctx=256))
    with pytest.raises(HypuraError, match="does not match"):
        hypura.Llama(str(smollm2_path), plan=plan, verbose=False)


def test_plan_and_overrides_are_exclusive(smollm2_path):
    with pytest.raises(HypuraError, match="give one of"):
        hypura.Llama(str(smollm2_path), ram="2GiB", override_tensor="ffn=CPU", verbose=False)
