"""Placement planning: which tier (gpu | ram | disk) every tensor and expert lives in.

    from hypura.profile import machine_profile   # cached profile of this machine, else a quick one
    plan = plan_model("model.gguf", machine_profile(), gpu_mem="8GiB", ram="32GiB")
    plan.placement("blk.3.ffn_up.weight").tier      # what the loader hook asks

    ask.py           Ask: the one load request every front end makes and decide() reads (DeviceAsk: its devices)
    decision.py      decide(): the one decision every front end applies before llama.cpp loads a model
    auto.py          the default path: placement and context from the free memory, as llama.cpp's --fit
    kv_cells.py      the cells of a cache the sequences share (serve -kvu): how many, weighed against the weights
    beside.py        a model kept resident beside the planned one (a draft): its room, on the GPU or in RAM
    load_params.py   llama.cpp's model and context parameters from the decision, with no I/O
    budget.py        budgets and rates from a profile, less the margins, with the user's overrides
    knobs.py         every tuning constant, with where its number comes from
    cost.py          the cost model: bytes moved per path -> predicted tok/s
    steps.py         a step's path through a placement, its prediction, a chat turn's time
    unit_sums.py     the search's sums over every unit of a placement at once
    model_orders.py  what the search needs of the model alone, made once for all its problems
    solve.py         the placement search: exact for the cost model's structure, and a greedy baseline
    search.py        the candidates searched; the smallest RAM budget that plans a model where none fits
    candidates.py    which candidate is kept: llama.cpp's kind of placement unless streaming clearly gains
    experts.py       the expert-cache alternative for an MoE plan
    microbatch.py    a prompt's micro-batch (n_ubatch) as large as pays
    shares.py        a model's layers split over several devices (GPUs, RPC servers) and the host
    split.py         when the decision splits a model over several devices, over what, within which budgets
    pools.py         how non-resident tensors move: whole through a pool's slots, or expert by expert
    plan.py          Plan: every tensor's (and expert's) place, frozen and JSON-serialisable
    report.py        plans and profiles as text a person reads

plan_model (here): a model planned for a machine within budgets (an MoE's greedy fill kept where it predicts faster).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from hypura.errors import HypuraError
from hypura.modelfile import ModelHeader, read_header
from hypura.plan.budget import Budgets, RateOverrides, budgets_for, fmt_size, parse_size, rates_for
from hypura.plan.cost import Prediction, Rates, Traffic, predict, traffic
from hypura.plan.experts import with_expert_cache
from hypura.plan.latest import Latest
from hypura.plan.plan import Plan, TensorPlacement, build_plan
from hypura.plan.search import greedy, optimize
from hypura.plan.solve import PlanSettings
from hypura.plan.steps import turn_seconds
from hypura.profile.machine import MachineProfile
from hypura.units import ModelUnits, model_units

SOLVERS = {"optimizer": optimize, "greedy": greedy}


def plan_model(model: str | os.PathLike | ModelHeader, profile: MachineProfile, *,
               gpu_mem: str | int | None = None, ram: str | int | None = None, disk: bool = True,
               settings: PlanSettings = PlanSettings(), overrides: RateOverrides = RateOverrides(),
               solver: str = "optimizer", expert_probs: Mapping[int, Sequence[float]] | None = None) -> Plan:
    """Plan a model (path or parsed header) for a machine; raises HypuraError when nothing fits."""
    header = model if isinstance(model, ModelHeader) else read_header(model)
    mu = _units(header, expert_probs)
    budgets = budgets_for(profile, 0 if overrides.no_gpu else gpu_mem, ram, disk)
    rates = rates_for(profile, overrides)

    def plan_with(solve) -> Plan:
        return with_expert_cache(build_plan(str(header.path), mu, solve(mu, budgets, rates, settings), settings,
                                            budgets, rates), mu, expert_probs)

    plan = plan_with(SOLVERS[solver])
    if solver == "optimizer" and mu.experts:
        # an expert cache takes the GPU bytes a static plan gave experts: the greedy fill may give more
        try:
            alt = plan_with(greedy)
        except HypuraError:
            return plan
        if turn_seconds(alt.prediction) < turn_seconds(plan.prediction):
            return alt
    return plan


_latest: Latest[tuple] = Latest()  # (header, expert_probs, their units)


def _units(header: ModelHeader, expert_probs: Mapping[int, Sequence[float]] | None) -> ModelUnits:
    """model_units, made again only for another header or routing: a decision plans one model at several contexts
    and micro-batches, and the search keeps what depends on the model alone for the same units (plan/model_orders.py)."""
    return _latest.get(lambda held: held[0] is header and held[1] is expert_probs,
                       lambda: (header, expert_probs, model_units(header, expert_probs)))[2]


__all__ = ["Budgets", "ModelUnits", "Plan", "PlanSettings", "Prediction", "RateOverrides", "Rates", "SOLVERS",
           "TensorPlacement", "Traffic", "budgets_for", "fmt_size", "greedy", "model_units", "optimize",
           "parse_size", "plan_model", "predict", "rates_for", "traffic"]
