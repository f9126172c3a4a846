"""How many KV cells a server's unified cache holds (`hypura serve -kvu`, EngineConfig.kv_unified, Ask.kv_cells):
chosen here, once, with the planner's cost model, between one sequence's context and every sequence's.

The sequences present share the cells (engine/admission.py): a request waits until its cells fit, so fewer cells
than -np x -c refuse no request that fits alone, they only make some wait. More cells cost memory the plan would
give weights: on the GPU (the cache there, or the weights it displaces), or in RAM. The candidates are one
sequence's context (-c), doubled up to -np x -c; each is decided as the server would load it (decision.decide at
that context), and scored as plans are scored (solve.py: a plan for several sequences serves one too, both count):

    seconds a token for one client alone                   (the plan's one-sequence prediction)
  + seconds a token of the k sequences the cells hold       (its step table at k = cells / -c: each sequence at its
    decoded together                                         full context, the worst case)

The most cells within CTX_DECODE_TOLERANCE of the best score are taken (more cells: fewer waits for requests
shorter than -c). Without a GPU to weigh them against (a CPU host, or a plan that uses none) the cells are what RAM
allows: the most whose plan keeps every weight in the tier it has at the fewest cells (KV never pushes a weight
to disk). Where llama.cpp's placement fits -np x -c cells, or the ask decided the placement (a plan file, -ngl N,
tensor overrides, a split over devices), the cells are -np x -c, as without -kvu.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from hypura.errors import HypuraError
from hypura.plan.auto import CTX_DECODE_TOLERANCE
from hypura.plan.budget import fmt_size
from hypura.plan.plan import Plan
from hypura.tiers.names import GPU, RAM
from hypura.units import model_units


@dataclass(frozen=True)
class CellChoice:
    """What the choice found: the cells, where they live, and what they cost in weights on the GPU."""

    cells: int  # the unified cache's cells: the context llama.cpp creates
    parallel: int  # -np
    per_seq: int  # -c: the tokens a request may hold alone (the fewest cells)
    tier: str  # gpu | ram; "" where llama.cpp's placement decides
    kv_bytes: int
    gpu_weights: int = 0  # weight bytes on the GPU at these cells (0: no plan)
    weights_given: int = 0  # weight bytes the GPU holds at the fewest cells and not at these (0: none, or no plan)
    one_tok_s: float = 0.0  # predicted decode of one client alone (0: no plan)
    held_tok_s: float = 0.0  # predicted aggregate decode of the sequences the cells hold at full context
    why: str = ""  # what decided it, in a few words

    @property
    def asked(self) -> int:
        return self.parallel * self.per_seq

    @property
    def held(self) -> int:
        """Sequences the cells hold at their full context."""
        return held(self.cells, self.per_seq, self.parallel)

    def describe(self) -> str:
        where = {GPU: "on the GPU", RAM: "in RAM"}.get(self.tier, "placed by llama.cpp")
        out = (f"KV cells {self.cells} of {self.asked} (-np {self.parallel} x -c {self.per_seq}), "
               f"{fmt_size(self.kv_bytes)} {where}")
        if self.gpu_weights or self.weights_given:
            out += f"; costs {fmt_size(self.weights_given)} of weights on the GPU ({fmt_size(self.gpu_weights)} there)"
        if self.one_tok_s:
            out += (f"; predicts {self.one_tok_s:.2f} tok/s for one alone, {self.held_tok_s:.2f} for {self.held} "
                    "at full context together")
        return out + (f" ({self.why})" if self.why else "")


def held(cells: int, per_seq: int, parallel: int) -> int:
    return max(1, min(parallel, cells // per_seq))


def candidates(asked: int, parallel: int) -> list[int]:
    """One sequence's context doubled up to every sequence's, smallest first."""
    per_seq = max(1, asked // parallel)
    out, c = [], per_seq
    while c < asked:
        out.append(c)
        c *= 2
    return out + [asked]


def rate_at(plan: Plan, k: int) -> float:
    """The plan's predicted aggregate decode at steps of k sequences: its own step, one alone, or its step table;
    else a step's time taken between one's and its own step's, in proportion to k (plans with no step table:
    resident tiers, whose step time grows with the tokens' compute and the experts they read)."""
    pr = plan.prediction
    one = plan.one_decode_tok_s
    if k >= pr.parallel or not one:
        return pr.decode_tok_s * min(1.0, k / pr.parallel)
    if k == 1:
        return one
    for tokens, _, rate in plan.step_paths:
        if tokens == k:
            return rate
    t1, t_all = 1 / one, pr.parallel / pr.decode_tok_s
    return k / (t1 + (t_all - t1) * (k - 1) / (pr.parallel - 1))


def score(plan: Plan, cells: int, per_seq: int, parallel: int) -> float:
    """Seconds a token for one client alone plus seconds a token of the sequences the cells hold (module doc)."""
    return 1 / rate_at(plan, 1) + 1 / rate_at(plan, held(cells, per_seq, parallel))


def choose_cells(header, ask, decide_at: Callable):
    """The decision for `ask` (an Ask with kv_cells, n_ctx = -np x -c) at the cells chosen (module docstring), with
    its CellChoice (Decision.cells). decide_at(ask): decision.decide for an ask without kv_cells."""
    dims = model_units(header).dims

    def kv_bytes(cells: int) -> int:  # the cache's bytes where no plan says
        return dims.kv_bytes_per_layer(cells, ask.planner.kv_bytes_per_element) * dims.n_layer

    asked, parallel = ask.n_ctx, ask.parallel
    per_seq = max(1, asked // parallel)
    plain = dataclasses.replace(ask, kv_cells=False)
    at = lambda c, **kw: decide_at(dataclasses.replace(plain, n_ctx=c, **kw))  # noqa: E731
    decided = (ask.plan is not None and str(ask.plan) != "auto") or ask.devices.given
    try:
        full, refused = at(asked), None
    except HypuraError as e:
        full, refused = None, e
    if full is not None and (decided or full.plan is None or full.fits or parallel == 1):
        why = ("llama.cpp's placement fits them" if full.fits else "the placement was given" if full.plan is None
               or decided else "")
        return _with(full, _choice(full, asked, per_seq, parallel, kv_bytes, ask.n_gpu_layers != 0, why=why))
    # each candidate planned as `hypura inspect` plans it: a plan even where llama.cpp's placement fits
    planned: dict[int, object] = {} if full is None else {asked: full}
    for c in candidates(asked, parallel)[:-1]:
        try:
            planned[c] = at(c, always_plan=True)
        except HypuraError as e:
            refused = refused or e
    if not planned:
        raise refused
    smallest = planned[min(planned)].plan
    cells, why = _pick(planned, per_seq, parallel)
    # a candidate whose placement does not fit was decided as the load decides it (always_plan changes nothing
    # there); one that fits is decided again, for llama.cpp's placement
    chosen = full if cells == asked else planned[cells] if not planned[cells].fits else at(cells)
    return _with(chosen, _choice(chosen, cells, per_seq, parallel, kv_bytes, ask.n_gpu_layers != 0, smallest, why))


def _pick(planned: dict, per_seq: int, parallel: int) -> tuple[int, str]:
    """(cells, why) among the candidates' decisions, each with a plan (module docstring)."""
    plans = {c: d.plan for c, d in planned.items()}
    smallest = plans[min(plans)]
    if not (smallest.rates.has_gpu and smallest.memory[GPU]["budget"] > 0):
        tiers = smallest.bytes_by_tier()  # llama.cpp's placement, where it fits, keeps every weight in RAM
        return (max(c for c, d in planned.items() if d.fits or d.plan.bytes_by_tier() == tiers),
                "the most RAM holds beside the weights")
    scores = {c: score(p, c, per_seq, parallel) for c, p in plans.items()}
    best = min(scores.values())
    return max(c for c, s in scores.items() if s <= best * (1 + CTX_DECODE_TOLERANCE)), "the fastest for one and all"


def _choice(d, cells: int, per_seq: int, parallel: int, kv_bytes: Callable[[int], int], gpu_layers: bool,
            smallest: Optional[Plan] = None, why: str = "") -> CellChoice:
    plan = d.plan
    if plan is None:
        on_gpu = d.free is not None and bool(d.free.gpu) and gpu_layers
        tier = (GPU if on_gpu else RAM) if d.fits else ""
        return CellChoice(cells, parallel, per_seq, tier, kv_bytes(cells), why=why)
    gpu = plan.bytes_by_tier()[GPU]
    given = max(0, smallest.bytes_by_tier()[GPU] - gpu) if smallest is not None else 0
    return CellChoice(cells, parallel, per_seq, plan.kv_tier, plan.kv_bytes, gpu, given, rate_at(plan, 1),
                      rate_at(plan, held(cells, per_seq, parallel)), why)


def _with(d, choice: CellChoice):
    """The decision with its choice; its line stays the decision's (`inspect -kvu` and the server say the choice)."""
    return dataclasses.replace(d, cells=choice)


__all__ = ["CellChoice", "candidates", "choose_cells", "rate_at", "score"]
