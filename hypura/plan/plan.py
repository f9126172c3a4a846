"""The Plan: where every tensor (and every expert of a stacked expert tensor) lives, as a frozen,
JSON-serialisable object. The loader hook asks `plan.placement(name)` for each tensor it loads:

    tier gpu  -> GPU buffer (resident)
    tier ram  -> host buffer; pinned when some step streams it into GPU slots (`step_paths`: its home, moved into
                 a slot at those steps), else plain
    tier disk -> not loaded; streamed with O_DIRECT (into GPU slots or RAM staging by `compute`)

A stacked expert tensor has a tier per expert (`experts`); its own `tier` is the slowest of them. A layer's
stacks with every expert in RAM may stream whole at large steps (`step_paths`), as dense RAM tensors do.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hypura.errors import HypuraError
from hypura.cachefile import write_atomic
from hypura.jsonfile import parse_json, read_json_file
from hypura.plan.cost import CPU, DISK, GPU, RAM, Prediction, Rates, Traffic
from hypura.plan.solve import PlanSettings, Solution
from hypura.plan.steps import step_rates
from hypura.units import ModelUnits
from hypura.tiers.names import TIERS  # noqa: F401  (re-exported)

PLAN_VERSION = 1
_SLOWEST = {GPU: 0, RAM: 1, DISK: 2}


@dataclass(frozen=True)
class TensorPlacement:
    name: str
    tier: str  # gpu | ram | disk (stacked experts: the slowest expert's tier)
    compute: str  # gpu | cpu: where decode computes it (stacked experts: gpu if any expert is)
    nbytes: int
    layer: int
    experts: tuple[str, ...] = ()  # stacked expert tensors: the tier of each expert
    expert_compute: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    model: str
    arch: str
    n_layer: int
    n_ctx: int
    n_ubatch: int
    mode: str  # full-resident | dense-ffn-streaming | expert-streaming | expert-cache | mixed
    solver: str  # optimizer | greedy (the optimizer's best candidate may be the greedy one)
    config: str
    tensors: tuple[TensorPlacement, ...]
    kv_tier: str
    kv_bytes: int
    pool_slots: int  # GPU slots for streamed layers (prefetch depth + the one computing)
    pool_slot_bytes: int
    staging_slots: int  # pinned RAM slots that disk reads land in
    staging_slot_bytes: int
    prefetch_depth: int
    expert_cache: dict  # tier -> experts held there (all layers)
    memory: dict  # tier -> {"budget": bytes, part: bytes, ...}
    unified: bool  # GPU bytes are RAM bytes too
    traffic: Traffic
    prediction: Prediction
    rates: Rates
    version: int = PLAN_VERSION
    expert_slots: int = 0  # > 0: an expert cache of this many GPU slots a MoE layer (plan/experts.py)
    expert_hit_rate: float = 0.0  # the hit rate its prediction assumes
    routing_tokens: int = 0  # > 0: expert frequencies came from this many tokens of recorded routing
    # per-step paths: ((tokens, RAM tensors streamed into GPU slots at steps of up to that many tokens, predicted
    # aggregate tok/s), ...) in rising order; the CPU computes the other RAM tensors. Empty: `compute` at every step
    step_paths: tuple = ()
    why: str = ""  # why the planner chose this placement over its other candidates, where it matters
    # a plan for several sequences (prediction.parallel > 1): one sequence's predicted decode, on its own step's
    # path, reading its own KV cells (what one client of a server gets); 0: not predicted (an older plan)
    one_decode_tok_s: float = 0.0

    # --- what the loader and the runtime ask ------------------------------------------------
    def _index(self) -> dict[str, TensorPlacement]:
        idx = self.__dict__.get("_idx")
        if idx is None:
            idx = {t.name: t for t in self.tensors}
            object.__setattr__(self, "_idx", idx)  # a cache, not state: frozen otherwise
        return idx

    def placement(self, name: str) -> TensorPlacement:
        try:
            return self._index()[name]
        except KeyError:
            raise HypuraError(f"tensor '{name}' is not in the plan (was it made for another model?)") from None

    def streamed_at(self, tokens: int) -> frozenset[str]:
        """The RAM tensors a step of `tokens` tokens streams into GPU slots (`step_paths`); one set per step size,
        made once (the runtime asks before every decode)."""
        if not self.step_paths:
            return frozenset()
        sets = self.__dict__.get("_streamed_sets")
        if sets is None:  # a cache, not state: frozen otherwise
            sets = [(k, frozenset(names)) for k, names, _ in self.step_paths]
            object.__setattr__(self, "_streamed_sets", sets)
        return next((names for k, names in sets if tokens <= k), sets[-1][1])

    @property
    def dual(self) -> frozenset[str]:
        """The RAM tensors some step sizes stream and others compute in place (any row of `step_paths`): dense
        ones, and the stacked experts of layers whose experts are all in RAM, streamed whole."""
        names = self.__dict__.get("_dual")
        if names is None:  # a cache, not state: frozen otherwise
            names = frozenset(name for step in self.step_paths for name in step[1])
            object.__setattr__(self, "_dual", names)
        return names

    @property
    def streams_stacks(self) -> bool:
        """Some step streams a layer's stacked expert tensors whole (their home is the layer streamer's pinned RAM,
        which an expert cache cannot share)."""
        return any(self.placement(name).experts for name in self.dual)

    def compute_at(self, t: TensorPlacement, tokens: int) -> str:
        """Where a step of `tokens` tokens computes t: a RAM tensor by the step's own path, where the plan
        has per-step paths (a stacked expert tensor where some step streams it); else t.compute."""
        if not self.step_paths or t.tier != RAM or (t.experts and t.name not in self.dual):
            return t.compute
        return GPU if t.name in self.streamed_at(tokens) else CPU

    def step_seconds(self, tokens: int) -> float:
        """Predicted seconds of a step of `tokens` tokens: the step table's size at or above it, else the plan's
        own step (its weights' bytes bound it, whatever the step carries)."""
        size, rate = next(((k, r) for k, _, r in self.step_paths if tokens <= k), (self.prediction.parallel,
                                                                                   self.prediction.decode_tok_s))
        return size / rate if rate > 0 else float("inf")

    def tier_of(self, name: str) -> str:
        return self.placement(name).tier

    def expert_tiers(self, name: str) -> tuple[str, ...]:
        return self.placement(name).experts

    def check_model(self, header) -> None:
        """Refuse a plan made for another model: every tensor must be planned, with its size."""
        idx = self._index()
        for t in header.tensors:
            planned = idx.get(t.name)
            if planned is None or planned.nbytes != t.nbytes:
                raise HypuraError(f"plan for {Path(self.model).name} does not match {header.path.name}: "
                                  f"tensor '{t.name}' {'is not planned' if planned is None else 'differs in size'}")
        if len(idx) != len(header.tensors):
            raise HypuraError(f"plan for {Path(self.model).name} has tensors {header.path.name} lacks")

    # --- summaries ----------------------------------------------------------------------------
    def bytes_by_tier(self) -> dict[str, int]:
        return {tier: self.memory[tier]["weights"] for tier in TIERS}

    def tensors_by_tier(self) -> dict[str, int]:
        c = Counter(t.tier for t in self.tensors)
        return {tier: c.get(tier, 0) for tier in TIERS}

    def layer_bytes(self) -> list[dict[str, int]]:
        """Per block, weight bytes in each tier (experts split by their own tiers)."""
        rows = [dict.fromkeys(TIERS, 0) for _ in range(self.n_layer)]
        for t in self.tensors:
            if not 0 <= t.layer < self.n_layer:
                continue
            if t.experts:
                for tier in t.experts:
                    rows[t.layer][tier] += t.nbytes // len(t.experts)
            else:
                rows[t.layer][t.tier] += t.nbytes
        return rows

    def used(self, tier: str) -> int:
        return sum(v for k, v in self.memory[tier].items() if k != "budget")

    # --- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k in ("traffic", "prediction", "rates"):
            d[k] = dataclasses.asdict(d[k])
        d["tensors"] = [dataclasses.asdict(t) for t in self.tensors]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        if d.get("version") != PLAN_VERSION:
            raise HypuraError(f"plan format v{d.get('version')} is not v{PLAN_VERSION}: re-run `hypura inspect --json`")
        try:
            fields = {f.name for f in dataclasses.fields(cls)}
            kw = {k: v for k, v in d.items() if k in fields}
            kw["tensors"] = tuple(TensorPlacement(**{**t, "experts": tuple(t["experts"]),
                                                     "expert_compute": tuple(t["expert_compute"])})
                                  for t in d["tensors"])
            kw["step_paths"] = tuple((int(k), tuple(names), float(r)) for k, names, r in d.get("step_paths", ()))
            kw["traffic"], kw["prediction"], kw["rates"] = (
                Traffic(**d["traffic"]), Prediction(**d["prediction"]), Rates(**d["rates"]))
            return cls(**kw)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise HypuraError(f"malformed plan ({type(e).__name__}: {e})") from None

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(parse_json(text, "plan"))

    def save(self, path: str | os.PathLike) -> Path:
        return write_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        d = read_json_file(path, "plan")
        try:
            return cls.from_dict(d)
        except HypuraError as e:
            raise HypuraError(f"{path}: {e}") from None


def mode_of(mu: ModelUnits, tiers: tuple[str, ...], fast: str) -> str:
    """Named by which roles live off the fastest tier used (the input embeddings always stay on the
    host in llama.cpp and do not count)."""
    off = {u.role for u, t in zip(mu.units, tiers) if t != fast and not u.host_only}
    if not off:
        return "full-resident"
    if off <= {"expert"}:
        return "expert-streaming"
    if off <= {"ffn", "shared"}:
        return "dense-ffn-streaming"
    return "mixed"


def build_plan(model: str, mu: ModelUnits, sol: Solution, settings: PlanSettings, budgets, rates: Rates) -> Plan:
    units = mu.units
    fast = GPU if GPU in sol.tiers else RAM  # a CPU-only plan is resident when all is in RAM
    per_tensor: dict[str, list] = {}
    for u, tier, dev in zip(units, sol.tiers, sol.compute):
        for name in u.tensors:
            per_tensor.setdefault(name, []).append((u.expert, tier, dev))
    placements = []
    for t in mu.tensors:
        rows = sorted(per_tensor[t.name])
        if t.name in mu.experts:
            tiers, devs = tuple(r[1] for r in rows), tuple(r[2] for r in rows)
            tier = max(tiers, key=_SLOWEST.get)
            dev = GPU if GPU in devs else CPU
            placements.append(TensorPlacement(t.name, tier, dev, t.nbytes, t.layer, tiers, devs))
        else:
            placements.append(TensorPlacement(t.name, rows[0][1], rows[0][2], t.nbytes, t.layer))
    experts = Counter(t for u, t in zip(units, sol.tiers) if u.expert >= 0)
    memory = {tier: {"budget": {GPU: budgets.gpu, RAM: budgets.ram, DISK: 0}[tier], **parts}
              for tier, parts in sol.memory.items()}
    plan = Plan(
        model=model, arch=mu.dims.arch, n_layer=mu.dims.n_layer, n_ctx=settings.n_ctx, n_ubatch=settings.n_ubatch,
        mode=mode_of(mu, sol.tiers, fast), solver=sol.solver, config=sol.config, tensors=tuple(placements),
        kv_tier=sol.kv_tier, kv_bytes=sol.memory[sol.kv_tier]["kv"],
        pool_slots=settings.prefetch_depth + 1 if sol.slot_bytes else 0, pool_slot_bytes=sol.slot_bytes,
        staging_slots=(sol.stage_slots or settings.prefetch_depth + 1) if sol.staging_bytes else 0,
        staging_slot_bytes=sol.staging_bytes,
        prefetch_depth=settings.prefetch_depth, expert_cache={t: experts.get(t, 0) for t in TIERS},
        memory=memory, unified=budgets.unified, traffic=sol.traffic, prediction=sol.prediction, rates=rates,
        step_paths=tuple((k, tuple(sorted({name for i in moved for name in units[i].tensors})), rate)
                         for (k, moved), rate in zip(sol.steps, step_rates(mu, sol, rates, settings))),
        why=sol.why, one_decode_tok_s=sol.one.decode_tok_s if sol.one is not None else 0.0,
    )
    _check_budgets(plan)
    return plan


def _check_budgets(plan: Plan) -> None:
    """Never hand out a plan that over-commits a tier (a solver bug if it fires)."""
    gpu, ram = plan.used(GPU), plan.used(RAM) + (plan.used(GPU) if plan.unified else 0)
    if gpu > plan.memory[GPU]["budget"] or ram > plan.memory[RAM]["budget"]:
        raise AssertionError(f"plan over budget: gpu {gpu} > {plan.memory[GPU]['budget']} or ram {ram} > "
                             f"{plan.memory[RAM]['budget']}")
