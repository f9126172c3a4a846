"""The one decision (hypura/plan/decision.py): what each ask decides, from the header, the free memory and the
profile passed in (nothing measured: a bundled profile and a stated free memory)."""

import dataclasses

import pytest

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan.auto import Fit
from hypura.plan.decision import Ask, Routing, decide
from hypura.profile import resolve_profile
from hypura.profile.free import FreeMemory

MiB, GiB = 1 << 20, 1 << 30


def free(ram: int) -> FreeMemory:
    return FreeMemory(gpu=None, ram=ram, gpu_total=None, ram_total=8 * GiB, source="test")


def never():
    raise AssertionError("measured where the decision did not need it")


def test_each_ask_decides_its_own_way(tiny_llama):
    header, profile = read_header(tiny_llama), resolve_profile("h200-design")
    # fits the free memory: llama.cpp's placement, and neither the profile nor the routing is read
    fits = decide(header, Ask(n_ctx=256, n_gpu_layers=0), free(8 * GiB), never, routing=never)
    assert fits.plan is None and fits.n_ctx == 256 and fits.line.startswith("hypura: fits") and fits.fits
    # asked to plan anyway (`hypura list --plan`, inspect): the plan within the same memory, still said to fit
    both = decide(header, Ask(n_ctx=256, n_gpu_layers=0, always_plan=True), free(8 * GiB), profile, routing=Routing())
    assert both.fits and both.plan is not None and both.n_ctx == 256 and both.line == fits.line
    tight = decide(header, Ask(n_ctx=256, n_gpu_layers=0, fit=Fit(ram_margin=0)), free(256 * MiB), profile,
                   routing=Routing())  # room for a plan, not for llama.cpp's resident placement
    assert tight.plan is not None and not tight.fits
    # llama.cpp's placement given, or --fit off: nothing decided, nothing measured
    for ask in (Ask(n_ctx=256, n_gpu_layers=3), Ask(n_ctx=256, placement=True), Ask(n_ctx=256, expert_cache=True),
                Ask(n_ctx=256, fit=Fit(enabled=False))):
        d = decide(header, ask, never, never, routing=never)
        assert d.plan is None and d.n_ctx == 256 and d.line == "" and not d.params.fields()["context_params"]
    # budgets: a plan for the step size asked, at the context asked
    planned = decide(header, Ask(gpu_mem=0, ram="2GiB", n_ctx=512, parallel=4), None, profile)
    assert planned.plan.prediction.parallel == 4 and planned.n_ctx == planned.plan.n_ctx == 512
    # a plan given: that plan, at its context when none is asked, its op offload applied
    off = dataclasses.replace(planned.plan, traffic=dataclasses.replace(planned.plan.traffic, op_offload=False))
    given = decide(header, Ask(plan=off), never, never)
    assert given.plan is off and given.n_ctx == 512 and given.params.op_offload is False


def test_an_unset_context_with_budgets_is_chosen_as_the_default_path_chooses_it(tiny_llama):
    header = read_header(tiny_llama)
    d = decide(header, Ask(gpu_mem=0, ram="2GiB", fit=Fit(min_ctx=1024)), None, resolve_profile("h200-design"),
               routing=Routing())
    assert d.plan.n_ctx >= 1024 and d.n_ctx == d.plan.n_ctx and d.line.startswith("hypura: plan from the budgets")


def test_conflicting_asks_are_one_clear_error(tiny_llama):
    header, profile = read_header(tiny_llama), resolve_profile("h200-design")
    plan = decide(header, Ask(gpu_mem=0, ram="2GiB", n_ctx=256), None, profile).plan
    with pytest.raises(HypuraError, match="not both"):
        decide(header, Ask(plan=plan, ram="2GiB"), None, profile)
    with pytest.raises(HypuraError, match="give one of"):
        decide(header, Ask(ram="2GiB", placement=True), None, profile)
    with pytest.raises(HypuraError, match="more than this machine has"):
        decide(header, Ask(ram="64GiB"), free(4 * GiB), profile)


def test_ask_of_fills_the_request_once():
    """Ask.of, the request every front end makes for a load: llama-cpp-python's defaults filled, and the llama.cpp
    values the decision reads taken from them and the params fields (a field given wins over a keyword)."""
    ask = Ask.of(n_ctx=512, n_gpu_layers=-1, gpu_mem="1GiB", parallel=2,
                 param_overrides={"context_params": {"n_ubatch": 64}})
    assert ask.llama["n_batch"] == 512 and ask.llama["verbose"] is True  # llama_cpp.Llama's defaults
    assert (ask.n_ctx, ask.n_ubatch, ask.n_batch, ask.n_gpu_layers, ask.parallel) == (512, 64, 512, -1, 2)
    assert ask.gpu_mem == "1GiB" and "gpu_mem" not in ask.llama and not ask.placement
    assert Ask.of(vocab_only=True).fit.enabled is False  # no weight to place: nothing to fit
    with pytest.raises(HypuraError, match="give one of plan"):
        Ask.of(placement_policy=lambda info: None, override_tensor="x=CPU")
