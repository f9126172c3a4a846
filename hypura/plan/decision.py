"""The one decision every front end applies before llama.cpp loads a model: from the model's header, what
the user asked, the free memory, the machine's profile and the sequences the caller decodes together, the plan
(or llama.cpp's own placement), the context, and why; then everything llama.cpp's load needs: its model and
context parameters and the thread counts, from one pure function of the plan, the ask and the machine
(load_params.py), which the runtime and the loader apply.

    asked                                   decided
    a plan (a Plan, a plan file)            that plan, at the context asked (unset: the plan's)
    "auto", or gpu_mem/ram budgets          a plan made now within them; an unset context as plan/auto.py
                                            chooses one (the smallest, grown while decode keeps its speed)
    llama.cpp's placement (-ngl N, -ot,     nothing: llama.cpp places the model as given
      a placement policy, an expert cache)
    nothing, --fit on                       the default path (plan/auto.py): llama.cpp's placement where the
                                            model fits the free memory, else a plan within it
    RPC servers or a split over devices     the layers split over them and the host (split.py), loaded as
      (every layer offered, nothing placed)   llama.cpp's layer split; other device asks: llama.cpp's placement

Nothing is measured or read here but a plan file named in the ask: hypura.Llama and `hypura inspect` measure
the free memory, read the profile and the model's recorded routing, and pass them in (the free memory and
the profile as values, or as functions called only where the decision needs them: a model that fits never
measures a profile; the RPC devices are measured only where a split is planned).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

from hypura.errors import HypuraError
from hypura.plan import knobs
from hypura.plan.ask import Ask, Planner
from hypura.plan.auto import default_path, free_caps, plan_unset_context, summary
from hypura.plan.beside import Beside
from hypura.plan.budget import Budgets, budgets_for, check_budgets, fmt_size
from hypura.plan.kv_cells import CellChoice, choose_cells
from hypura.plan.load_params import Host, LoadParams, load_params
from hypura.plan.make import plan_model
from hypura.plan.microbatch import largest_paying
from hypura.plan.plan import Plan
from hypura.plan.shares import DeviceShares
from hypura.plan.solve import PlanSettings
from hypura.plan.split import Devices, describe, plan_split, splits
from hypura.tiers.names import GPU, RAM
from hypura.profile.free import FreeMemory
from hypura.profile.machine import MachineProfile


@dataclass(frozen=True)
class Routing:
    """Each MoE layer's expert frequencies, from this model's recorded routing, and the tokens they come from
    (probs None: uniform, k of E): often-chosen experts take RAM before rare ones."""

    probs: Optional[Mapping[int, Sequence[float]]] = None
    tokens: int = 0


@dataclass(frozen=True)
class Decision:
    plan: Optional[Plan]  # None: llama.cpp places the model
    n_ctx: int  # the context to create (0: llama.cpp's, the training context)
    params: LoadParams  # llama.cpp's parameters and threads for the load (load_params.py)
    line: str = ""  # what the user is told; "" where the ask decided it (a plan given, llama.cpp's placement)
    free: Optional[FreeMemory] = None  # the free memory the decision was made within, where it was needed
    fits: bool = False  # the default path found llama.cpp's placement fits (the plan, if any: Ask.always_plan's)
    beside_on_gpu: Optional[bool] = None  # where Ask.beside was reserved (None: nowhere; it places itself)
    devices: Optional[tuple[str, ...]] = None  # llama_model_params.devices (None: llama.cpp's default list)
    shares: Optional[DeviceShares] = None  # the split over several devices, where one was planned (split.py)
    # what the load hands llama.cpp and the runtime: llama-cpp-python's keywords and the params fields with what was
    # decided (the context set once, _load_fields), and the request's own placement, expert cache and router hook
    keywords: Mapping[str, object] = field(default_factory=dict)
    param_overrides: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    placement_policy: Optional[Callable] = None  # TensorInfo -> Placement (hypura.runtime.placement)
    override_tensor: Union[str, Iterable[str], None] = None  # llama.cpp's -ot
    expert_cache: object = None  # ExpertCacheSettings or slots per layer (the plan's where None)
    on_route: Optional[Callable] = None
    cells: Optional[CellChoice] = None  # Ask.kv_cells: the unified cache's cells chosen, and why (kv_cells.py)


Source = Union[FreeMemory, MachineProfile, Callable[[], object], None]


def decide(header, ask: Ask, free: Source, profile: Source,
           routing: Union[Routing, Callable[[], Routing]] = Routing(), host: Optional[Host] = None,
           devices: Union[Devices, Callable[[], Devices]] = Devices()) -> Decision:
    """The decision for `header` (module docstring). free: FreeMemory (None: another machine's plan, budgets
    not checked, no default path); profile: the MachineProfile to plan with; routing: the recorded routing to
    plan with; host: the machine the load's parameters are for (None: this one; without `free`, the profile's);
    devices: the RPC devices and GPUs a split is planned over (split.py). The plan's cost model optimises
    steps of ask.parallel tokens (the sequences decoded together)."""
    if ask.kv_cells and ask.n_ctx:  # the cells of a cache the sequences share: chosen by kv_cells.py
        free, profile, routing = (None if free is None else _once(free)), _once(profile), _once(routing)
        return choose_cells(header, ask, lambda a: decide(header, a, free, profile, routing, host, devices))
    if ask.devices.given and splits(ask):  # several devices, the split planned over them
        return _Deciding(header, ask, free, profile, routing, host).split(_once(devices)())
    if ask.devices.given:  # other device asks: llama.cpp's placement over them
        ask = dataclasses.replace(ask, placement=True)
    d = _Deciding(header, ask, free, profile, routing, host)
    if ask.plan is not None or ask.gpu_mem is not None or ask.ram is not None:
        return d.planned()
    llama_places = ask.n_gpu_layers not in (0, -1)  # -ngl N: llama.cpp's split, as given
    if ask.placement or ask.expert_cache is not None or llama_places or not ask.fit.enabled or free is None:
        return d.applied(None, ask.n_ctx)
    return d.default()


class _Deciding:
    """One decision's inputs (the free memory, profile and routing each read at most once, where needed) and the
    plans it makes; `drafts` records where the plan at each context keeps the draft beside it (on the GPU: True)."""

    def __init__(self, header, ask: Ask, free: Source, profile: Source, routing, host: Optional[Host]):
        self.header, self.ask, self.host, self.here = header, ask, host, free is not None
        self.free, self.machine, self.recorded = _once(free), _once(profile), _once(routing)
        self.drafts: dict[int, bool] = {}

    def applied(self, plan: Optional[Plan], n_ctx: int, line: str = "", beside_on_gpu: Optional[bool] = None,
                shares: Optional[DeviceShares] = None) -> Decision:
        """The decision, with everything llama.cpp's load is handed (load_params.py, _load_fields)."""
        ask = self.ask
        host = self.host or (Host.here() if self.here else Host.profiled(self.machine()))
        params = load_params(plan, n_ctx, ask, host)
        keywords, fields = _load_fields(ask, n_ctx, params, shares)
        devices = ask.devices.names if shares is None else shares.device_names() or ("none",)
        return Decision(plan, n_ctx, params, line, beside_on_gpu=beside_on_gpu, devices=devices, shares=shares,
                        keywords=keywords, param_overrides=fields, placement_policy=ask.placement_policy,
                        override_tensor=ask.override_tensor, expert_cache=ask.expert_cache, on_route=ask.on_route)

    def split(self, devices: Devices) -> Decision:
        """The layers split over several devices and the host (split.py), loaded as llama.cpp's layer split."""
        shares = plan_split(self.header, self.ask, devices, self.machine(),
                            self.free().ram if self.here else None)
        return self.applied(None, shares.n_ctx, f"hypura: devices: {describe(shares)}", shares=shares)

    def planned(self) -> Decision:
        """A plan given, or made now within the budgets (or "auto"), at the context asked or one chosen."""
        ask, budgets = self.ask, self.ask.gpu_mem is not None or self.ask.ram is not None
        if ask.placement:
            raise HypuraError("give one of plan (or gpu_mem/ram budgets), placement_policy and override_tensor")
        if budgets and self.here:
            check_budgets(ask.gpu_mem, ask.ram, self.free())
        if ask.plan is not None and str(ask.plan) != "auto":
            if budgets:
                raise HypuraError("give a plan or gpu_mem/ram budgets (which make a plan), not both")
            plan = ask.plan if isinstance(ask.plan, Plan) else Plan.load(ask.plan)
            plan.check_model(self.header)
            return self.applied(plan, ask.n_ctx or plan.n_ctx)
        beside = None  # the budgets a draft beside is reserved within
        if ask.beside is not None:
            beside = budgets_for(self.machine(), 0 if ask.planner.overrides.no_gpu else ask.gpu_mem, ask.ram)
        plan_at = functools.partial(self.within_budgets, beside)
        if ask.n_ctx:
            return self.applied(self.grown(plan_at(ask.n_ctx)), ask.n_ctx, beside_on_gpu=self.drafts.get(ask.n_ctx))
        plan = self.grown(plan_unset_context(plan_at, self.header, ask.fit.min_ctx))
        on_gpu = self.drafts.get(plan.n_ctx)
        line = f"hypura: plan{' from the budgets' if budgets else ''}: {summary(plan)}"
        return self.applied(plan, plan.n_ctx, line + _beside_note(ask.beside, on_gpu, plan.n_ctx), on_gpu)

    def default(self) -> Decision:
        """The default path (plan/auto.py): llama.cpp's placement where the model fits the free memory, else a
        plan within it; a draft beside reserved in either."""
        ask, mem = self.ask, self.free()
        on_gpu = ask.n_gpu_layers != 0 and mem.gpu is not None
        fit = _DefaultFit(self, on_gpu and unified_memory(), free_caps(mem, ask.fit, on_gpu)[0])
        plan, n_ctx, line, fits = default_path(
            self.header, ask.n_ctx, ask.n_ubatch, ask.n_gpu_layers != 0, ask.fit, mem, fit.unified, self.machine,
            fit.within, ask.always_plan, fit.reserve, self.grown)
        draft_on_gpu = fit.first(n_ctx) if fits else self.drafts.get(n_ctx)
        line += _beside_note(ask.beside, draft_on_gpu, n_ctx)
        return dataclasses.replace(self.applied(plan, n_ctx, line, draft_on_gpu), free=mem, fits=fits)

    def within_budgets(self, beside: Optional[Budgets], n_ctx: int) -> Plan:
        """The plan within the asked budgets at `n_ctx`; with a draft beside, within `beside` less its room."""
        if beside is None:
            return self.plan_within(self.machine(), self.ask.gpu_mem, self.ask.ram, n_ctx)
        return self.beside_planned(self.machine(), beside.gpu, beside.ram, n_ctx, beside.unified)

    def plan_within(self, prof, gpu_mem, ram, n_ctx: int, n_ubatch: Optional[int] = None) -> Plan:
        """The plan of the model within these budgets, at this context and micro-batch (the asked one: None)."""
        ask, p, r = self.ask, self.ask.planner, self.recorded()
        n_ubatch = ask.n_ubatch if n_ubatch is None else n_ubatch
        outputs = ask.n_outputs if n_ubatch > ask.n_ubatch else 0  # only a grown micro-batch sets n_outputs_max
        settings = PlanSettings(n_ctx=n_ctx, n_ubatch=n_ubatch, prefetch_depth=p.prefetch_depth,
                                kv_bytes_per_element=p.kv_bytes_per_element, parallel=ask.parallel, n_outputs=outputs)
        plan = plan_model(self.header, prof, gpu_mem=gpu_mem, ram=ram, disk=p.disk, settings=settings,
                          overrides=p.overrides, solver=p.solver, expert_probs=r.probs)
        return dataclasses.replace(plan, routing_tokens=r.tokens) if r.probs else plan

    def grown(self, plan: Plan) -> Plan:
        """The plan at the micro-batch that pays (plan/microbatch.py), made again at its context and budgets once
        those are chosen; a micro-batch the user gave stands."""
        if self.ask.n_ubatch != knobs.N_UBATCH:
            return plan
        again = functools.partial(self.plan_within, self.machine(), plan.memory[GPU]["budget"],
                                  plan.memory[RAM]["budget"], plan.n_ctx)
        return largest_paying(plan, again, plan.n_ctx)

    def beside_planned(self, prof, gpu: int, ram: int, n_ctx: int, unified: bool) -> Plan:
        """The plan within (gpu, ram) with the draft beside kept within them too: on the GPU (when it fits there)
        and in RAM, the plan whose speculative pass is faster (plan/beside.py); `drafts` records where."""
        beside, best, error = self.ask.beside, None, None
        for on_gpu in beside.options(gpu, n_ctx):
            g, r = beside.reserved(on_gpu, n_ctx, unified)
            try:
                if r > ram:
                    raise HypuraError(f"the draft {beside.name} needs {fmt_size(r)} of RAM at context {n_ctx}, "
                                      f"more than the {fmt_size(ram)} budget")
                plan = self.plan_within(prof, gpu - g, ram - r, n_ctx)
            except HypuraError as e:
                error = error or e
                continue
            seconds = beside.pass_seconds(plan, on_gpu)
            if best is None or seconds < best[0]:
                best = (seconds, on_gpu, plan)
        if best is None:
            raise error
        self.drafts[n_ctx] = best[1]
        return best[2]


@dataclass(frozen=True)
class _DefaultFit:
    """The default path's view of a draft beside (none: nothing reserved): beside llama.cpp's placement it goes to
    the GPU if it fits the free GPU memory (`gpu_cap`); a plan keeps its own room for it."""

    deciding: _Deciding
    unified: bool
    gpu_cap: int

    def first(self, n_ctx: int) -> Optional[bool]:
        beside = self.deciding.ask.beside
        return None if beside is None else beside.options(self.gpu_cap, n_ctx)[0]

    def reserve(self, n_ctx: int) -> tuple[int, int]:
        beside = self.deciding.ask.beside
        return (0, 0) if beside is None else beside.reserved(self.first(n_ctx), n_ctx, self.unified)

    def within(self, prof, caps, n_ctx: int) -> Plan:
        if self.deciding.ask.beside is None:
            return self.deciding.plan_within(prof, caps.gpu, caps.ram, n_ctx)
        return self.deciding.beside_planned(prof, caps.gpu, caps.ram, n_ctx, self.unified)


def _load_fields(ask: Ask, n_ctx: int, params: LoadParams, shares: Optional[DeviceShares]) -> tuple[dict, dict]:
    """llama-cpp-python's keywords and the params fields a load hands llama.cpp: the caller's, with the context,
    its batches and threads decided (load_params.py) and a split's layers over its devices; n_ctx set here alone."""
    keywords = dict(ask.llama)
    fields = {name: dict(given) for name, given in (ask.param_overrides or {}).items()}
    if shares is not None:  # llama.cpp's layer split over the devices, as llama-completion's flags set it
        keywords.update(n_gpu_layers=shares.n_gpu_layers, tensor_split=list(shares.tensor_split()) or None)
        fields.setdefault("model_params", {})["n_gpu_layers"] = shares.n_gpu_layers
    keywords.update(params.keywords())
    context = fields.setdefault("context_params", {})
    if shares is not None or "n_ctx" in context:  # a field the caller gave (or the split's) holds the one context
        context["n_ctx"] = n_ctx
    return keywords, fields


def _beside_note(beside: Optional[Beside], on_gpu: Optional[bool], n_ctx: int) -> str:
    if beside is None or on_gpu is None:
        return ""
    return f"; draft {beside.name}: {fmt_size(beside.nbytes(n_ctx))} {'on the GPU' if on_gpu else 'in RAM'}, kept beside"


def _once(source: Source) -> Callable[[], object]:
    """A value, or a function called at most once, as a function."""
    if not callable(source):
        return lambda: source
    memo = []
    return lambda: memo[0] if memo else memo.append(source()) or memo[0]


def unified_memory() -> bool:
    """The GPU shares host RAM (a fixed fact of the machine, not a measurement)."""
    from hypura.profile.devices import local_gpus

    gpus = local_gpus()
    return bool(gpus and gpus[0].unified)


__all__ = ["Ask", "Decision", "Planner", "Routing", "decide", "unified_memory"]
