"""The search over candidate placements: each config `_Problem` solves (plan/solve.py) is a candidate, the kept
one is candidates.choose's, and where none fits the error says the smallest RAM budget that plans the model.

Greedy baseline: what a llama.cpp user does with -ngl: whole layers on the GPU from the last one
down while they fit, the rest in RAM in graph order, then disk; the CPU computes everything not on
the GPU; no streaming slots. The optimizer's candidates add the fill by density, streaming, the KV cache's
tier, op offload off and pinned CPU weights, with the greedy ones among them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from hypura.errors import HypuraError
from hypura.plan import knobs
from hypura.plan.budget import Budgets, fmt_size
from hypura.plan.candidates import choose
from hypura.plan.cost import RAM, Rates
from hypura.plan.latest import Latest
from hypura.plan.microbatch import floor_microbatch
from hypura.plan.solve import PlanSettings, Solution, _Problem, _Shortfall
from hypura.sizes import fmt_mib
from hypura.units import ModelUnits


def _pick(candidates: list, problem: _Problem, candidates_of: Callable[[_Problem], Iterable]) -> Solution:
    """The solution kept (candidates.choose); none: the shortfall nearest to fitting, with the smallest RAM budget
    that plans the model (_floor) where RAM is what fell short."""
    solutions = [c for c in candidates if isinstance(c, Solution)]
    if solutions:
        return choose(solutions)
    short = min(candidates, key=lambda c: c.need - c.have)
    mu, b = problem.mu, problem.b
    floor = _floor(problem, candidates_of) if short.tier == RAM and b.disk else None
    need = (f"at least {fmt_mib(floor)} (the smallest --ram that plans this model here)" if floor is not None
            else fmt_size(short.need))
    raise HypuraError(
        f"no placement fits: {short.tier} needs {need} but has {fmt_size(short.have)} "
        f"({short.detail}); model weights {fmt_size(mu.weight_bytes)} + KV cache {fmt_size(problem.kv)} "
        f"(ctx {problem.s.n_ctx}) + compute buffers {fmt_size(problem.buf)}; budgets: gpu {fmt_size(b.gpu)}, "
        f"ram {fmt_size(b.ram)}, disk streaming {'on' if b.disk else 'off'}")


# the RAM floor is searched to within this share of itself (or FLOOR_STEP, if larger): a budget is given in MiB
FLOOR_PRECISION = 1 / 128
FLOOR_STEP = 1 << 20


def _floor(problem: _Problem, candidates_of: Callable[[_Problem], Iterable]) -> int | None:
    """The smallest RAM budget (to FLOOR_PRECISION) at which candidates_of finds a solution, with the GPU budget,
    rates and settings of `problem`. None: nothing fits at any RAM (the GPU's own share falls short). Plans only
    grow with RAM (a placement that fits fits in more), so bisection, from 0 (the same answer for every caller)."""
    def fits(ram: int) -> bool:
        # the first candidate that fits answers: the rest are not solved (candidates_of yields them one by one)
        return any(isinstance(c, Solution) for c in candidates_of(problem.with_ram(ram)))

    d = problem.mu.dims
    # everything in RAM fits, with every buffer and reservation there is
    hi = (problem.mu.weight_bytes + problem.kv + problem.buf + problem.cpu_buf + knobs.GPU_PROCESS_RAM
          + knobs.PROCESS_RAM + (problem.n_slots + 1) * max(u.nbytes for u in problem.mu.units) * max(1, d.n_expert_used or 1))
    if not fits(hi):
        return None
    lo = 0
    while hi - lo > max(FLOOR_STEP, hi * FLOOR_PRECISION):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def ram_floor(mu: ModelUnits, budgets: Budgets, rates: Rates, settings: PlanSettings = PlanSettings(),
              solver: str = "optimizer") -> int | None:
    """The smallest --ram at which plan_model plans the model, the rest of `budgets` as given (_floor): at the
    smallest micro-batch it may take (microbatch.floor_microbatch)."""
    d = mu.dims
    u = floor_microbatch(settings.n_ubatch, d.n_expert, d.n_expert_used if mu.experts else 0, settings.parallel,
                         rates.has_gpu)
    return _floor(_Problem(mu, budgets, rates, dataclasses.replace(settings, n_ubatch=u)), _OF[solver])


def _greedy_candidates(p: _Problem, pins: tuple = (False,)) -> list:
    return list(_greedy_each(p, pins))


def _greedy_each(p: _Problem, pins: tuple = (False,)) -> Iterator[Solution | _Shortfall]:
    # llama.cpp's kind keeps the KV cache with its GPU layers (as candidates.beside_gpu_kv keeps every candidate's
    # where it fits): whole CPU layers beside a KV cache in RAM compute every layer's attention on the CPU
    return (p.solve(p.fill_like_ngl, g, kv, False, "greedy", True, pin) for g, kv, _ in p.configs((False,))
            if not (g and kv == RAM) for pin in pins)


def _optimize_candidates(p: _Problem) -> list:
    return list(_optimize_each(p))


def _optimize_each(p: _Problem) -> Iterator[Solution | _Shortfall]:
    """The optimizer's candidates, each solved when asked for."""
    rates, settings = p.r, p.s
    streams = (False, True) if rates.can_stream_to_gpu else (False,)
    # from OP_OFFLOAD_MIN_BATCH sequences on, op offload copies CPU weights every step: a plan may turn it
    # off (the CPU computes them, prompts too), which the objective weighs against slower prefill
    offloads = (True, False) if rates.has_gpu and settings.parallel >= knobs.OP_OFFLOAD_MIN_BATCH else (True,)
    # without streaming, CPU weights as llama.cpp holds them (repacked where it repacks: the CPU's faster layout)
    # or pinned (plain: a prompt's copies at the link's rate), as the turn weighs them
    pins = (False, True) if rates.can_stream_to_gpu and not rates.unified else (False,)
    yield from (p.solve(p.fill_by_density, g, kv, st, "optimizer", off, pin)
                for g, kv, st in p.configs(streams) for off in offloads for pin in (pins if not st else (True,)))
    # llama.cpp's fill (whole layers, as -ngl) pinned too: a prompt's copies at the link's rate beside its decode
    yield from _greedy_each(p, pins)


_OF = {"optimizer": _optimize_each, "greedy": _greedy_each}


_latest: Latest[_Problem] = Latest()


def _problem(mu: ModelUnits, budgets: Budgets, rates: Rates, settings: PlanSettings) -> _Problem:
    """The problem of these inputs, one for the solvers asked of them one after the other (plan_model asks the
    optimizer, then the greedy baseline of an MoE): the configs both try are solved once (_Problem.solve)."""
    return _latest.get(lambda p: p.mu is mu and (p.b, p.r, p.s) == (budgets, rates, settings),
                       lambda: _Problem(mu, budgets, rates, settings))


def greedy(mu: ModelUnits, budgets: Budgets, rates: Rates, settings: PlanSettings = PlanSettings()) -> Solution:
    p = _problem(mu, budgets, rates, settings)
    return _pick(_greedy_candidates(p), p, _greedy_each)


def optimize(mu: ModelUnits, budgets: Budgets, rates: Rates, settings: PlanSettings = PlanSettings()) -> Solution:
    """The best of the enumerated configs; the greedy baseline is one more candidate, so the result is
    never worse than it on the cost model."""
    p = _problem(mu, budgets, rates, settings)
    return _pick(_optimize_candidates(p), p, _optimize_each)
