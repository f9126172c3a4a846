"""The search's sums over every unit at once (plan/unit_sums.py) are the unit-by-unit ones to the last bit: a step's
StepLoad as StepLoad.add builds it, a layer's slot bytes as the loop over units counts them, and so the same plans,
ties included, as the search that added each unit one by one."""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict

import numpy as np
import pytest

from hypura.modelfile import read_header
from hypura.plan import PlanSettings, budgets_for, model_units, rates_for
from hypura.plan.cost import CPU, DISK, GPU, RAM, StepLoad, step_probability
from hypura.plan.search import _optimize_candidates
from hypura.plan.solve import _Problem
from hypura.plan.steps import kv_read
from hypura.plan.unit_sums import CODE, UnitSums, codes, walk_seconds
from hypura.profile.store import resolve_profile
from hypura.synth import writer

H200 = resolve_profile("h200-design")  # a discrete GPU with a pinned link: every step streams
M1 = resolve_profile("m1-max-32gb")  # unified memory: disk units need no link copy


SHAPES = [("qwen3-30b-a3b", 6), ("mixtral-8x7b", 2), ("llama3.1-8b", 12)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for name, layers in SHAPES:
        path = tmp_path_factory.mktemp("sums") / f"{name}.gguf"
        writer.write_synth(name, path, layers=layers, ftype="q4_k_m", sparse=True)  # header only: planned, not run
        out[name] = model_units(read_header(path))
    return out


@pytest.fixture(params=[name for name, _ in SHAPES])
def mu(request, models):
    return models[request.param]


def _unit_by_unit(mu, rates, parallel, tiers, compute) -> StepLoad:
    step = StepLoad(rates, parallel)
    for u, t, c in zip(mu.units, tiers, compute):
        step.add(u, t, c)
    return step


def _stage_need_by_unit(mu, tiers, compute, select) -> dict[int, int]:
    """The slot bytes each layer needs, unit by unit (the loop _Problem.stage_need was)."""
    dense, experts = defaultdict(int), defaultdict(list)
    for u, t, c in zip(mu.units, tiers, compute):
        if u.host_only or not select(t, c):
            continue
        if u.expert >= 0 and t != RAM:
            experts[u.stage].append(u.nbytes)
        else:
            dense[u.stage] += u.nbytes
    k = mu.dims.n_expert_used or 1
    return {s: dense[s] + sum(sorted(experts[s], reverse=True)[:k]) for s in dense.keys() | experts.keys()}


@pytest.mark.parametrize("profile", [H200, M1], ids=["discrete", "unified"])
def test_a_steps_load_is_the_unit_by_unit_sum_to_the_bit(mu, profile):
    rates, sums, rng = rates_for(profile), UnitSums(mu), random.Random(41)
    for parallel in (1, 7, 16, 512):
        for _ in range(4):
            tiers = [rng.choice((GPU, RAM, RAM, DISK)) for _ in mu.units]
            compute = [GPU if t == GPU else rng.choice((CPU, GPU)) for t in tiers]
            fast = sums.load(StepLoad(rates, parallel), sums.placed(codes(tiers), codes(compute), rates.unified))
            assert dataclasses.asdict(fast) == dataclasses.asdict(_unit_by_unit(mu, rates, parallel, tiers, compute))


def test_a_layers_slot_bytes_are_the_unit_by_unit_count(mu):
    p, rng = _Problem(mu, budgets_for(H200, "8GiB", "64GiB"), rates_for(H200), PlanSettings()), random.Random(7)
    selects = [lambda t, c: t != GPU and c == GPU, lambda t, c: t == DISK, lambda t, c: True]
    for _ in range(4):
        tiers = [rng.choice((GPU, RAM, DISK)) for _ in mu.units]
        compute = [GPU if t == GPU else rng.choice((CPU, GPU)) for t in tiers]
        for select in selects:
            assert p.stage_need(tiers, compute, select) == _stage_need_by_unit(mu, tiers, compute, select)


# budgets where some candidates stream per step: a MoE's expert stacks and a dense model's layers
@pytest.mark.parametrize("name, gpu_mem, ram", [
    ("qwen3-30b-a3b", "2GiB", "64GiB"), ("qwen3-30b-a3b", "1500MiB", "2GiB"),
    ("llama3.1-8b", "1500MiB", "64GiB"), ("llama3.1-8b", "2GiB", "2GiB")])
@pytest.mark.parametrize("parallel", [1, 16])
def test_the_search_plans_what_it_planned_adding_unit_by_unit(models, monkeypatch, name, gpu_mem, ram, parallel):
    """Every candidate (tiers, split, step table, prediction) equals the one the search finds when each step's load
    and each layer's slot bytes are summed unit by unit."""
    mu = models[name]

    def problem():
        return _Problem(mu, budgets_for(H200, gpu_mem, ram), rates_for(H200), PlanSettings(parallel=parallel))

    fast = _optimize_candidates(problem())
    assert any(getattr(c, "steps", ()) for c in fast)  # the per-step split ran

    with monkeypatch.context() as m:
        m.setattr(_Problem, "_best_prefixes", _best_prefixes_by_unit)
        m.setattr(_Problem, "stage_need", lambda self, tiers, compute, select: _stage_need_by_unit(
            mu, _names(tiers), _names(compute), select))
        slow = _optimize_candidates(problem())
    assert fast == slow


def _names(tiers) -> list[str]:
    """Tiers or devices as names, from CODE arrays (the search passes both)."""
    return [_NAME[c] for c in tiers.tolist()] if isinstance(tiers, np.ndarray) else list(tiers)


_NAME = {code: name for name, code in CODE.items()}


def _walk_by_unit(p: _Problem, walk, tiers, kv_tier, op_offload, parallel, pinned) -> list[float]:
    """The step's time before any move and after each of the walk's, unit by unit (the loop the split was)."""
    units = p.mu.units
    step = StepLoad(p.r, parallel, op_offload, pinned)
    for u, t, c in zip(units, tiers, walk.compute):
        step.add(u, t, c)
    step.add_kv(kv_tier, kv_read(p.kv, parallel, p.s.parallel))
    times = [step.seconds()]
    for group in walk.moves:
        if len(group) > 1:
            g = [units[i] for i in group]
            step.move_stacks(sum(step_probability(u.p, parallel) * u.nbytes for u in g),
                             sum(2.0 * parallel * u.elements * u.p for u in g), float(sum(u.nbytes for u in g)))
        else:
            step.add(units[group[0]], tiers[group[0]], CPU, -1)
            step.add(units[group[0]], tiers[group[0]], GPU)
        times.append(step.seconds())
    return times


def _best_prefixes_by_unit(self, walk, kv_tier, op_offload, sizes, pinned) -> list[int]:
    out = []
    for k in sizes:
        times = _walk_by_unit(self, walk, walk.tiers, kv_tier, op_offload, k, pinned)
        best, best_n = times[0], 0
        for n, t in enumerate(times[1:], 1):
            if t < best:
                best, best_n = t, n
        out.append(best_n)
    return out


@pytest.mark.parametrize("profile", [H200, M1], ids=["discrete", "unified"])
def test_the_walks_times_are_the_unit_by_unit_ones_to_the_bit(mu, profile):
    """At every prefix of the split's walk (disk and RAM units, a layer's stacks), with and without op offload and
    pinning, at steps below and above op offload's batch."""
    p, rng = _Problem(mu, budgets_for(profile, "8GiB", "64GiB"), rates_for(profile), PlanSettings()), random.Random(3)
    for _ in range(3):
        tiers = [rng.choice((GPU, RAM, RAM, DISK)) for _ in mu.units]
        for e in rng.sample(sorted(p.expert_groups), min(2, len(p.expert_groups))):  # layers all in RAM: stacks move
            for i in p.expert_groups[e]:
                tiers[i] = RAM
        base = [GPU if t == GPU else rng.choice((CPU, GPU)) for t in tiers]
        for walk in (p._walk(tiers, None, True), p._walk(tiers, base, True)):
            for op_offload, pinned, kv_tier in [(True, False, GPU), (True, True, RAM), (False, True, GPU)]:
                sizes = [1, 16, 31, 32, 512]  # below and above op offload's batch, at once
                steps = [p.sums.load(StepLoad(p.r, k, op_offload, pinned), walk.placed) for k in sizes]
                for step in steps:
                    step.add_kv(kv_tier, kv_read(p.kv, step.parallel, p.s.parallel))
                fast = walk_seconds(steps, [p._moves(walk, k) for k in sizes]).tolist()
                assert fast == [_walk_by_unit(p, walk, tiers, kv_tier, op_offload, k, pinned) for k in sizes]
