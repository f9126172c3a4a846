"""plan_model: a model planned for a machine within budgets, by the search (solve.py, search.py) or the greedy fill;
an MoE's greedy fill kept where it predicts faster, since an expert cache takes the GPU bytes a static plan gave
experts."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from hypura.errors import HypuraError
from hypura.modelfile import ModelHeader, read_header
from hypura.plan.budget import RateOverrides, budgets_for, rates_for
from hypura.plan.experts import with_expert_cache
from hypura.plan.latest import Latest
from hypura.plan.microbatch import within_staging
from hypura.plan.plan import Plan, build_plan
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
    """Plan a model (path or parsed header) for a machine; raises HypuraError when nothing fits. A CPU plan that
    pages experts from disk may take a smaller micro-batch than settings.n_ubatch (microbatch.within_staging)."""
    header = model if isinstance(model, ModelHeader) else read_header(model)
    mu = _units(header, expert_probs)
    budgets = budgets_for(profile, 0 if overrides.no_gpu else gpu_mem, ram, disk)
    rates = rates_for(profile, overrides)
    d = mu.dims

    def at(n_ubatch: int) -> Plan:
        return _planned(header, mu, budgets, rates, dataclasses.replace(settings, n_ubatch=n_ubatch), solver,
                        expert_probs)

    return within_staging(at, settings.n_ubatch, d.n_expert, d.n_expert_used if mu.experts else 0, settings.parallel,
                          rates.has_gpu)


def _planned(header: ModelHeader, mu: ModelUnits, budgets, rates, settings: PlanSettings, solver: str,
             expert_probs: Mapping[int, Sequence[float]] | None) -> Plan:
    """The plan at these settings: the solver's, or for an MoE the greedy fill's where it predicts faster."""

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


__all__ = ["SOLVERS", "plan_model"]
