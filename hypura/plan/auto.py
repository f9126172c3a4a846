"""The default path: placement and context chosen from what this machine has free, as llama.cpp's
`--fit` does, with Hypura's planner where llama.cpp would have to cut the model down.

When the user gives no placement (no plan, budgets, policy or tensor overrides; -ngl unset or "auto"),
`decide` looks at the free GPU memory and available RAM (hypura/profile/free.py), less the margins:

  1. the model fits as llama.cpp would run it (every layer on the GPU with one, or in RAM without),
     at the context asked for, or for an unset context at the largest of the training context, its
     halvings and `min_ctx` that fits: nothing changes, llama.cpp places it (zero overhead);
  2. else the planner places it within those budgets, disk for the rest (O_DIRECT, never mmap
     paging), at the context asked for, or for an unset context at `min_ctx` and then larger while
     no weight moves to a slower tier and predicted decode stays within CTX_DECODE_TOLERANCE.

One line on stderr says which, with the tiers, context, the predicted tok/s and the limiting link.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypura.errors import HypuraError
from hypura.plan import knobs
from hypura.plan.budget import fmt_size, parse_size
from hypura.plan.cost import DISK, GPU, RAM
from hypura.plan.plan import Plan
from hypura.plan.solve import PlanSettings
from hypura.plan.units import model_units
from hypura.profile.free import FreeMemory, free_memory

# llama.cpp's --fit-ctx default (common.h fit_params_min_ctx): an unset context is never cut below it
MIN_CTX = 4096
# a larger unset context is taken while predicted decode stays within this share of the smallest's
# (a context filled to the end reads its KV cache every token: knobs.KV_READ_FILL)
CTX_DECODE_TOLERANCE = 0.03
# contexts tried below an explicit -c, for the line saying which would keep the weights off disk
SMALLEST_SUGGESTED_CTX = 256
# ... said only where the KV cache is at least this share of the weights on disk, and a smaller context
# takes at least this share of them off (a model larger than RAM at any context is not the KV cache's doing)
CTX_NOTE_SHARE = 0.1


@dataclass(frozen=True)
class Fit:
    """llama.cpp's --fit (on by default) and its -fitt/-fitc, and where the free memory comes from."""

    enabled: bool = True  # --fit off: llama.cpp's placement, no planning
    gpu_margin: int = knobs.GPU_MARGIN  # -fitt: left free on the GPU
    ram_margin: int = knobs.RAM_MARGIN  # left to the OS and other programs
    min_ctx: int = MIN_CTX  # -fitc
    free: FreeMemory | None = None  # None: measured at load (hypura/profile/free.py)
    measure_profile: bool = True  # no cached machine profile: measure one (briefly) before planning
    say: Callable[[str], None] | None = None  # where the one line goes (None: stderr, when verbose)

    def __post_init__(self):
        if self.gpu_margin < 0 or self.ram_margin < 0 or self.min_ctx < 1:
            raise HypuraError("--fit-target must be >= 0 and --fit-ctx >= 1")


@dataclass(frozen=True)
class Decision:
    plan: Plan | None  # None: llama.cpp places the model (it fits)
    n_ctx: int
    free: FreeMemory
    line: str  # the one line the user is told


@dataclass(frozen=True)
class Request:
    """What the caller asked for: n_ctx 0 is unset (the planner chooses)."""

    n_ctx: int = 0
    n_ubatch: int = knobs.N_UBATCH
    parallel: int = 1
    use_gpu: bool = True  # False: n_gpu_layers=0, the CPU computes (a plan gets no GPU budget)


def _say_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def check_budgets(gpu_mem, ram, free: FreeMemory) -> None:
    """A budget larger than the machine has is a mistake, not a plan: one line with both figures."""
    if ram is not None and parse_size(ram) > free.ram_total:
        raise HypuraError(f"--ram {ram} is more than this machine has: {fmt_size(free.ram_total)} of RAM"
                          f" ({fmt_size(free.ram)} available now)")
    if gpu_mem is not None and parse_size(gpu_mem) > 0:
        if free.gpu_total is None:
            raise HypuraError(f"--gpu-mem {gpu_mem} given, but this llama.cpp build sees no GPU")
        if parse_size(gpu_mem) > free.gpu_total:
            raise HypuraError(f"--gpu-mem {gpu_mem} is more than the GPU has: {fmt_size(free.gpu_total)}"
                              f" ({fmt_size(free.gpu or 0)} free now)")


class _Model:
    """The model's memory as llama.cpp would hold it: weights, KV cache and compute buffers."""

    def __init__(self, header, request: Request):
        self.header, self.request = header, request
        self.mu = model_units(header)
        self.dims = self.mu.dims
        self.host_only = sum(u.nbytes for u in self.mu.units if u.host_only)
        self.buf = self.dims.compute_buffer_bytes(request.n_ubatch)
        self.n_train = int(header.get("context_length", 0) or MIN_CTX)

    def kv(self, n_ctx: int) -> int:
        return self.dims.kv_bytes_per_layer(n_ctx) * self.dims.n_layer

    def resident_need(self, n_ctx: int, on_gpu: bool, unified: bool) -> tuple[int, int]:
        """(GPU bytes, RAM bytes) llama.cpp takes with every layer on the GPU (on_gpu), else in RAM."""
        weights = self.mu.weight_bytes
        if not on_gpu:
            return 0, weights + self.kv(n_ctx) + self.buf
        gpu = weights - self.host_only + self.kv(n_ctx) + self.buf
        ram = self.host_only + knobs.HOST_BUFFER_OFFLOADED + knobs.GPU_PROCESS_RAM
        return gpu, ram + (gpu if unified else 0)

    def contexts(self, min_ctx: int) -> list[int]:
        return contexts_for(self.header, min_ctx)


def contexts_for(header, min_ctx: int = MIN_CTX) -> list[int]:
    """An unset context's candidates: the training context, its halvings, then the minimum (largest first)."""
    n_train = int(header.get("context_length", 0) or min_ctx)
    floor = min(min_ctx, n_train)
    out, c = [], n_train
    while c > floor:
        out.append(c)
        c //= 2
    return out + [floor]


def plan_unset_context(plan_at: Callable[[int], Plan], header, min_ctx: int = MIN_CTX) -> Plan:
    """The plan for an unset context, as the default path chooses it: at the minimum, then larger while
    that costs no weight a faster tier and little decode (grow_context). plan_at(n_ctx) makes a plan."""
    contexts = contexts_for(header, min_ctx)
    try:
        plan = plan_at(contexts[-1])
    except HypuraError as e:
        raise HypuraError(f"{e}; at context {contexts[-1]}, the smallest an unset context gets (-c or --fit-ctx "
                          "gives another)") from None
    return grow_context(plan, plan_at, contexts[:-1])


def decide(header, request: Request, fit: Fit = Fit(), profile=None,
           say: Callable[[str], None] | None = _say_stderr) -> Decision:
    """The default path's placement and context for `header` (module docstring); says it in one line."""
    free = fit.free or free_memory()
    m = _Model(header, request)
    on_gpu = request.use_gpu and free.gpu is not None
    unified = on_gpu and _unified()
    gpu_cap = max(0, (free.gpu or 0) - fit.gpu_margin) if on_gpu else 0
    ram_cap = max(0, free.ram - fit.ram_margin)
    margins = (f"less margins of {fmt_size(fit.gpu_margin)} GPU, {fmt_size(fit.ram_margin)} RAM" if on_gpu
               else f"less a {fmt_size(fit.ram_margin)} margin")
    contexts = [request.n_ctx] if request.n_ctx > 0 else m.contexts(fit.min_ctx)
    for c in contexts:
        gpu, ram = m.resident_need(c, on_gpu, unified)
        if gpu <= gpu_cap and ram <= ram_cap:
            where = "every layer on the GPU" if on_gpu else "in RAM"
            line = (f"hypura: fits: llama.cpp's placement ({where}), context {c}"
                    + ("" if request.n_ctx or c == m.n_train else f" (training context {m.n_train} does not fit)")
                    + f"; needs {fmt_size(gpu + ram)} of {free.describe()} {margins}")
            return _said(Decision(None, c, free, line), say)

    profile = profile or _profile(header, fit, say)
    gpu_mem = gpu_cap if on_gpu and profile.gpu is not None else 0
    plan_at = lambda c: _plan(header, profile, gpu_mem, ram_cap, request, c)  # noqa: E731
    if request.n_ctx > 0:
        plan = _plan_or_explain(plan_at, request.n_ctx, m, free, gpu_mem, ram_cap, margins, explicit=True)
        note = _ctx_note(plan, plan_at, request.n_ctx)
    else:
        plan = _plan_or_explain(plan_at, contexts[-1], m, free, gpu_mem, ram_cap, margins, explicit=False)
        plan = grow_context(plan, plan_at, contexts[:-1])
        note = "" if plan.n_ctx == m.n_train else f" (training context {m.n_train}: more would slow decode or not fit)"
    why = (f"needs {fmt_size(sum(m.resident_need(plan.n_ctx, on_gpu, unified)))} as llama.cpp would hold it, "
           f"{free.describe()} {margins}") + _disk_note(plan, profile)
    return _said(Decision(plan, plan.n_ctx, free, f"hypura: plan: {summary(plan)}{note}; why: {why}"), say)


def _disk_note(plan: Plan, profile) -> str:
    """The profile's disk rate is the model's disk's only if it was measured on the same filesystem."""
    if not plan.bytes_by_tier()[DISK]:
        return ""
    measured = profile.disk.path
    try:
        same = bool(measured) and os.stat(measured).st_dev == os.stat(plan.model).st_dev
    except OSError:
        same = False
    if same:
        return ""
    where = f"at {measured}, another filesystem" if measured else "not measured (a default)"
    return (f"; the disk rate was {where}: `hypura profile --force --model {plan.model}` measures the "
            "model's disk")


def _said(d: Decision, say) -> Decision:
    if say is not None:
        say(d.line)
    return d


def summary(plan: Plan) -> str:
    """Tiers, context and KV, the prediction and its limiting link: the plan in one phrase."""
    w = plan.bytes_by_tier()
    tiers = ", ".join(f"{t} {fmt_size(w[t])}" for t in (GPU, RAM, DISK) if w[t])
    pr = plan.prediction
    return (f"weights {tiers}; context {plan.n_ctx} (KV {fmt_size(plan.kv_bytes)} in {plan.kv_tier}); "
            f"predicts decode {pr.decode_tok_s:.2f} tok/s, limited by {pr.decode_limit}")


def _unified() -> bool:
    from hypura.profile.devices import list_devices

    gpus = [d for d in list_devices() if d.is_gpu]
    return bool(gpus and gpus[0].unified)


def _profile(header, fit: Fit, say):
    from hypura.profile.measure import planning_profile

    return planning_profile(header.path, say, measure=fit.measure_profile)


def _plan(header, profile, gpu_mem, ram, request: Request, n_ctx: int) -> Plan:
    from hypura.runtime.plan_policy import plan_with_routing

    settings = PlanSettings(n_ctx=n_ctx, n_ubatch=request.n_ubatch, parallel=request.parallel)
    return plan_with_routing(header, profile, gpu_mem=gpu_mem, ram=ram, settings=settings)


def _plan_or_explain(plan_at, n_ctx: int, m: _Model, free: FreeMemory, gpu_mem: int, ram: int, margins: str,
                     explicit: bool) -> Plan:
    try:
        return plan_at(n_ctx)
    except HypuraError as e:
        # what the tier lacks, without the planner's model and budget totals: the free memory follows
        detail = str(e).removeprefix("no placement fits: ").split("; model weights")[0]
    has = f"{free.describe()} {margins}"
    if explicit and m.kv(n_ctx) > gpu_mem + ram:
        raise HypuraError(f"-c {n_ctx}: its KV cache ({fmt_size(m.kv(n_ctx))}) does not fit in the free memory "
                          f"({fmt_size(gpu_mem + ram)}: {has}); the largest context that could is about "
                          f"{max(0, gpu_mem + ram - m.buf - m.host_only) // max(1, m.kv(1))}") from None
    raise HypuraError(f"not enough free memory to run {Path(m.header.path).name} at context {n_ctx}, even "
                      f"streaming from disk: {detail}; this machine has {has}") from None


def grow_context(plan: Plan, plan_at, larger: list[int]) -> Plan:
    """The largest context (tried smallest first) whose plan keeps the same weights in each tier and
    predicts decode within CTX_DECODE_TOLERANCE of the smallest context's plan."""
    base_tiers, base_tok_s = plan.bytes_by_tier(), plan.prediction.decode_tok_s
    for c in sorted(larger):
        try:
            p = plan_at(c)
        except HypuraError:
            break
        if p.bytes_by_tier() != base_tiers or p.prediction.decode_tok_s < base_tok_s * (1 - CTX_DECODE_TOLERANCE):
            break
        plan = p
    return plan


def _ctx_note(plan: Plan, plan_at, n_ctx: int) -> str:
    """An explicit context whose KV cache pushes weights onto disk: which -c would avoid it. Said only where
    the KV cache is the cause: a smaller context keeps every weight off disk, or takes a tenth of them off."""
    disk = plan.bytes_by_tier()[DISK]
    if not disk or plan.kv_bytes < CTX_NOTE_SHARE * disk:
        return ""
    c, best = n_ctx // 2, None
    while c >= SMALLEST_SUGGESTED_CTX:
        try:
            left = plan_at(c).bytes_by_tier()[DISK]
        except HypuraError:
            break
        if not left:
            best = (c, 0)
            break
        if best is None and left <= (1 - CTX_NOTE_SHARE) * disk:
            best = (c, left)
        c //= 2
    if best is None:
        return ""
    c, left = best
    better = "keep every weight off disk" if not left else f"put {fmt_size(left)} on disk instead"
    return (f" (-c {n_ctx}: its KV cache ({fmt_size(plan.kv_bytes)}) puts {fmt_size(disk)} of weights on disk; "
            f"-c {c} would {better})")


def llama_request(kwargs: dict, overrides: dict) -> Request | None:
    """From hypura.Llama's keywords: the Request, None when n_gpu_layers places the model (llama-cpp-python's
    default 0 is the CPU and -1 every layer on the GPU: both leave it to us; any other count does not)."""
    model = overrides.get("model_params", {})
    context = overrides.get("context_params", {})
    ngl = model.get("n_gpu_layers", kwargs.get("n_gpu_layers", 0))
    if ngl not in (0, -1):
        return None
    n_ctx = context.get("n_ctx", kwargs.get("n_ctx", 512))  # llama-cpp-python's default context
    n_ubatch = context.get("n_ubatch", kwargs.get("n_ubatch", knobs.N_UBATCH))
    return Request(n_ctx=n_ctx or 0, n_ubatch=n_ubatch, parallel=max(1, context.get("n_seq_max", 1)),
                   use_gpu=ngl != 0)


def default_path(header, kwargs: dict, overrides: dict, fit: Fit | bool | None, given: bool,
                 budgets: tuple = (None, None), verbose: bool = True) -> Decision | None:
    """hypura.Llama's one call: budgets checked against the machine; with no placement `given` and fit on,
    the Decision, its context written into kwargs and the context overrides (the plan is the caller's)."""
    fit = Fit(enabled=fit) if isinstance(fit, bool) or fit is None else fit
    say = fit.say or (_say_stderr if verbose else None)
    req = llama_request(kwargs, overrides)
    if any(b is not None for b in budgets):
        free = fit.free or free_memory()
        check_budgets(*budgets, free)
        n_ctx = overrides.get("context_params", {}).get("n_ctx", kwargs.get("n_ctx", 512))
        if given or n_ctx:
            return None  # hypura.Llama plans from the budgets at this context (resolve_plan)
        # an unset context with budgets: chosen as on the default path, not the training context's KV cache
        request = Request(n_ubatch=req.n_ubatch if req else knobs.N_UBATCH, parallel=req.parallel if req else 1)
        profile = _profile(header, fit, say)
        plan = plan_unset_context(lambda c: _plan(header, profile, *budgets, request, c), header, fit.min_ctx)
        decision = _said(Decision(plan, plan.n_ctx, free, f"hypura: plan from the budgets: {summary(plan)}"), say)
    elif given or not fit.enabled or req is None:
        return None
    else:
        decision = decide(header, req, fit, say=say)
    kwargs["n_ctx"] = decision.n_ctx
    context = overrides.setdefault("context_params", {})
    if "n_ctx" in context:
        context["n_ctx"] = decision.n_ctx
    if decision.plan is not None and not decision.plan.traffic.op_offload:
        context.setdefault("op_offload", False)  # the plan was made for many sequences without it (as loader.py)
    return decision


def resident_need(header, request: Request, on_gpu: bool) -> tuple[int, int]:
    """(GPU bytes, RAM bytes) the model takes as llama.cpp would hold it at request.n_ctx (every layer on
    the GPU when on_gpu, else in RAM): what `decide` checks against the free memory (a server's room)."""
    m = _Model(header, request)
    return m.resident_need(request.n_ctx or m.contexts(MIN_CTX)[-1], on_gpu, on_gpu and _unified())


__all__ = ["CTX_DECODE_TOLERANCE", "Decision", "Fit", "MIN_CTX", "Request", "check_budgets", "contexts_for",
           "decide", "default_path", "grow_context", "plan_unset_context", "resident_need", "summary"]
