"""A step and its path through a placement: the sizes a plan's step table holds (`step_sizes`), each unit's
compute at a step (`path_at`), the prediction there (`predict_step`, `step_rates`), the share of the KV cache a step
of some sequences reads (`kv_read`), and what plans minimise, a chat turn (`turn_seconds`). The search
(plan/solve.py) builds the table; the plan (plan/plan.py), the speed benchmarks and the report read it."""

from __future__ import annotations

from hypura.plan import knobs
from hypura.plan.cost import CPU, GPU, RAM, Prediction, Rates, predict, traffic
from hypura.units import ModelUnits


def step_rates(mu: ModelUnits, sol, rates: Rates, settings) -> tuple[float, ...]:
    """The predicted aggregate tok/s of each step size of the table of `sol` (a solve.Solution, planned with
    `settings`, its PlanSettings)."""
    kv = sol.memory[sol.kv_tier]["kv"]
    return tuple(predict_step(mu, sol.tiers, sol.compute, sol.steps, sol.kv_tier, kv_read(kv, k, settings.parallel),
                              rates, settings.n_ubatch, k, sol.traffic.op_offload, sol.traffic.host_pinned).decode_tok_s
                 for k, _ in sol.steps)


def kv_read(kv_bytes: float, tokens: int, parallel: int) -> float:
    """The KV cache a decode step of `tokens` sequences reads, of a cache the plan's `parallel` sequences share
    (the engine gives each an equal part): each sequence attends to its own cells (llama.cpp masks the others'
    and its CPU kernel skips them), so one client of a server reads its part, not the whole cache."""
    return kv_bytes * min(1.0, tokens / parallel)


def predict_step(mu: ModelUnits, tiers, compute, steps: tuple, kv_tier: str, kv: int, rates: Rates, n_ubatch: int,
                 tokens: int, op_offload: bool, pinned: bool = False) -> Prediction:
    """The prediction for a step of `tokens` tokens on its own path through the placement (path_at)."""
    return predict(traffic(mu, tiers, path_at(compute, tiers, steps, tokens), kv_tier, kv, rates, n_ubatch, tokens,
                           op_offload, pinned), rates)


def path_at(base, tiers, steps: tuple, tokens: int | None) -> list[str]:
    """Each unit's compute at a step of `tokens` tokens (None: GPU where any step streams it): RAM units
    streamed where the step table says, computed by the CPU otherwise; the rest as the plan's split `base`."""
    if not steps:
        return list(base)
    if tokens is None:
        moved = {i for step in steps for i in step[1]}
    else:
        moved = set(next((step[1] for step in steps if tokens <= step[0]), steps[-1][1]))
    path = [CPU if t == RAM else c for c, t in zip(base, tiers)]
    for i in moved:
        path[i] = GPU
    return path


def step_sizes(n_ubatch: int, parallel: int) -> list[int]:
    """The step sizes a plan's step table holds: 1, 2, 4, ... n_ubatch, the plan's own step (a server's sequences
    decoded together), and the largest step before op offload turns on (knobs.OP_OFFLOAD_MIN_BATCH). A step takes
    the path of the smallest size at or above it (path_at), so a path never assumes op offload a step lacks."""
    sizes, k = {n_ubatch, min(parallel, n_ubatch), min(knobs.OP_OFFLOAD_MIN_BATCH - 1, n_ubatch)}, 1
    while k < n_ubatch:
        sizes.add(k)
        k *= 2
    return sorted(sizes)


def turn_seconds(pr: Prediction) -> float:
    """What plans minimise: seconds for one chat turn (knobs.OBJECTIVE_*) at the predicted rates."""
    return knobs.OBJECTIVE_PROMPT_TOKENS / pr.prefill_tok_s + knobs.OBJECTIVE_DECODE_TOKENS / pr.decode_tok_s
