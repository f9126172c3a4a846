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
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Union

from hypura.errors import HypuraError
from hypura.plan import knobs, plan_model
from hypura.plan.ask import Ask, Planner
from hypura.plan.auto import default_path, free_caps, plan_unset_context, summary
from hypura.plan.beside import Beside
from hypura.plan.budget import budgets_for, check_budgets, fmt_size
from hypura.plan.kv_cells import CellChoice, choose_cells
from hypura.plan.load_params import Host, LoadParams, load_params
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
    cells: Optional[CellChoice] = None  # Ask.kv_cells: the unified cache's cells chosen, and why (kv_cells.py)

    def split_fields(self) -> dict:
        """llama-cpp-python's keywords the split sets (none without one)."""
        if self.shares is None:
            return {}
        return {"n_gpu_layers": self.shares.n_gpu_layers, "tensor_split": list(self.shares.tensor_split()) or None,
                "n_ctx": self.shares.n_ctx}


Source = Union[FreeMemory, MachineProfile, Callable[[], object], None]


def decide(header, ask: Ask, free: Source, profile: Source,
           routing: Union[Routing, Callable[[], Routing]] = Routing(), host: Optional[Host] = None,
           devices: Union[Devices, Callable[[], Devices]] = Devices()) -> Decision:
    """The decision for `header` (module docstring). free: FreeMemory (None: another machine's plan, budgets
    not checked, no default path); profile: the MachineProfile to plan with; routing: the recorded routing to
    plan with; host: the machine the load's parameters are for (None: this one; without `free`, the profile's);
    devices: the RPC devices and GPUs a split is planned over (split.py). The plan's cost model optimises
    steps of ask.parallel tokens (the sequences decoded together)."""
    free_now, machine, recorded = _once(free), _once(profile), _once(routing)
    parallel = ask.parallel
    if ask.kv_cells and ask.n_ctx:  # the cells of a cache the sequences share: chosen by kv_cells.py
        return choose_cells(header, ask, lambda a: decide(header, a, free_now if free is not None else None, machine,
                                                          recorded, host, devices))

    def applied(plan: Optional[Plan], n_ctx: int, line: str = "", beside_on_gpu: Optional[bool] = None) -> Decision:
        here = host or (Host.here() if free is not None else Host.profiled(machine()))
        return Decision(plan, n_ctx, load_params(plan, n_ctx, ask, here), line,
                        beside_on_gpu=beside_on_gpu, devices=ask.devices.names)

    if ask.devices.given:  # several devices: llama.cpp's placement over them, the split where one is planned
        if splits(ask):
            shares = plan_split(header, ask, _once(devices)(), machine(), free_now().ram if free is not None else None)
            return dataclasses.replace(applied(None, shares.n_ctx, f"hypura: devices: {describe(shares)}"),
                                       devices=shares.device_names() or ("none",), shares=shares)
        ask = dataclasses.replace(ask, placement=True)

    budgets = ask.gpu_mem is not None or ask.ram is not None

    def plan_within(prof, gpu_mem, ram, n_ctx: int, n_ubatch: int = ask.n_ubatch) -> Plan:
        p, r = ask.planner, recorded()
        outputs = ask.n_outputs if n_ubatch > ask.n_ubatch else 0  # only a grown micro-batch sets n_outputs_max
        settings = PlanSettings(n_ctx=n_ctx, n_ubatch=n_ubatch, prefetch_depth=p.prefetch_depth,
                                kv_bytes_per_element=p.kv_bytes_per_element, parallel=parallel, n_outputs=outputs)
        plan = plan_model(header, prof, gpu_mem=gpu_mem, ram=ram, disk=p.disk, settings=settings,
                          overrides=p.overrides, solver=p.solver, expert_probs=r.probs)
        return dataclasses.replace(plan, routing_tokens=r.tokens) if r.probs else plan

    def grown(plan: Plan) -> Plan:
        """The plan at the micro-batch that pays (plan/microbatch.py), made again at its context and budgets once
        those are chosen; a micro-batch the user gave stands."""
        if ask.n_ubatch != knobs.N_UBATCH:
            return plan
        gpu, ram = plan.memory[GPU]["budget"], plan.memory[RAM]["budget"]
        return largest_paying(plan, lambda u: plan_within(machine(), gpu, ram, plan.n_ctx, u), plan.n_ctx)

    if ask.plan is not None or budgets:
        if ask.placement:
            raise HypuraError("give one of plan (or gpu_mem/ram budgets), placement_policy and override_tensor")
        if budgets and free is not None:
            check_budgets(ask.gpu_mem, ask.ram, free_now())
        if ask.plan is not None and str(ask.plan) != "auto":
            if budgets:
                raise HypuraError("give a plan or gpu_mem/ram budgets (which make a plan), not both")
            plan = ask.plan if isinstance(ask.plan, Plan) else Plan.load(ask.plan)
            plan.check_model(header)
            return applied(plan, ask.n_ctx or plan.n_ctx)
        plan_at, drafts = lambda c: plan_within(machine(), ask.gpu_mem, ask.ram, c), {}  # noqa: E731
        if ask.beside is not None:
            b = budgets_for(machine(), 0 if ask.planner.overrides.no_gpu else ask.gpu_mem, ask.ram)
            beside = _beside_planned(ask.beside, plan_within, b.unified, drafts)
            plan_at = lambda c: beside(machine(), b.gpu, b.ram, c)  # noqa: E731
        if ask.n_ctx:
            return applied(grown(plan_at(ask.n_ctx)), ask.n_ctx, beside_on_gpu=drafts.get(ask.n_ctx))
        plan = grown(plan_unset_context(plan_at, header, ask.fit.min_ctx))
        on_gpu = drafts.get(plan.n_ctx)
        line = f"hypura: plan{' from the budgets' if budgets else ''}: {summary(plan)}"
        return applied(plan, plan.n_ctx, line + _beside_note(ask.beside, on_gpu, plan.n_ctx), on_gpu)
    llama_places = ask.n_gpu_layers not in (0, -1)  # -ngl N: llama.cpp's split, as given
    if ask.placement or ask.expert_cache is not None or llama_places or not ask.fit.enabled or free is None:
        return applied(None, ask.n_ctx)
    mem = free_now()
    on_gpu = ask.n_gpu_layers != 0 and mem.gpu is not None
    unified = on_gpu and unified_memory()
    within, reserve, drafts, first = plan_within, (lambda c: (0, 0)), {}, (lambda c: None)
    if ask.beside is not None:
        gpu_cap = free_caps(mem, ask.fit, on_gpu)[0]
        first = lambda c: ask.beside.options(gpu_cap, c)[0]  # noqa: E731  (beside llama.cpp's placement: the GPU if it fits)
        reserve = lambda c: ask.beside.reserved(first(c), c, unified)  # noqa: E731
        within = _beside_planned(ask.beside, plan_within, unified, drafts)
    plan, n_ctx, line, fits = default_path(
        header, ask.n_ctx, ask.n_ubatch, ask.n_gpu_layers != 0, ask.fit, mem, unified, machine,
        lambda prof, b, c: within(prof, b.gpu, b.ram, c), ask.always_plan, reserve, grown)
    draft_on_gpu = first(n_ctx) if fits else drafts.get(n_ctx)
    line += _beside_note(ask.beside, draft_on_gpu, n_ctx)
    return dataclasses.replace(applied(plan, n_ctx, line, draft_on_gpu), free=mem, fits=fits)


def _beside_planned(beside: Beside, plan_within: Callable, unified: bool, drafts: dict) -> Callable:
    """plan_within(profile, gpu, ram, n_ctx) with `beside` kept within those budgets: on the GPU (when it fits
    there) and in RAM, the plan whose speculative pass is faster (plan/beside.py); drafts[n_ctx] records where."""
    def planned(prof, gpu: int, ram: int, n_ctx: int) -> Plan:
        best, error = None, None
        for on_gpu in beside.options(gpu, n_ctx):
            g, r = beside.reserved(on_gpu, n_ctx, unified)
            try:
                if r > ram:
                    raise HypuraError(f"the draft {beside.name} needs {fmt_size(r)} of RAM at context {n_ctx}, "
                                      f"more than the {fmt_size(ram)} budget")
                plan = plan_within(prof, gpu - g, ram - r, n_ctx)
            except HypuraError as e:
                error = error or e
                continue
            seconds = beside.pass_seconds(plan, on_gpu)
            if best is None or seconds < best[0]:
                best = (seconds, on_gpu, plan)
        if best is None:
            raise error
        drafts[n_ctx] = best[1]
        return best[2]
    return planned


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
