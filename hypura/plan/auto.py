"""The default path: placement and context chosen from what this machine has free, as llama.cpp's
`--fit` does, with Hypura's planner where llama.cpp would have to cut the model down.

When the user gives no placement (no plan, budgets, policy or tensor overrides; -ngl unset or "auto"),
`default_path` looks at the free GPU memory and available RAM it is given, less the margins:

  1. the model fits as llama.cpp would run it (every layer on the GPU with one, or in RAM without),
     at the context asked for, or for an unset context at the largest of the training context, its
     halvings and `min_ctx` that fits: nothing changes, llama.cpp places it (zero overhead);
  2. else the planner places it within those budgets, disk for the rest (O_DIRECT, never mmap
     paging), at the context asked for, or for an unset context at `min_ctx` and then larger while
     no weight moves to a slower tier and predicted decode stays within CTX_DECODE_TOLERANCE;
  3. where neither fits, 1 and 2 again within the free RAM itself, no margin (said): never a refusal of a
     model llama.cpp would run in what is free.

One line says which, with the tiers, context, the predicted tok/s and the limiting link. The caller
(plan/decision.py, the one decision) measures nothing here: free memory and the profile come in.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypura.errors import HypuraError
from hypura.plan import knobs
from hypura.plan.budget import fmt_size
from hypura.plan.cost import DISK, GPU, RAM
from hypura.plan.plan import Plan
from hypura.profile.free import FreeMemory
from hypura.units import model_units

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


class _Model:
    """The model's memory as llama.cpp would hold it: weights, KV cache and compute buffers."""

    def __init__(self, header, n_ubatch: int):
        self.header = header
        self.mu = model_units(header)
        self.dims = self.mu.dims
        self.host_only = sum(u.nbytes for u in self.mu.units if u.host_only)
        self.buf = self.dims.compute_buffer_bytes(n_ubatch)
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


def plan_unset_context(plan_at: Callable[[int], Plan], header, min_ctx: int = MIN_CTX,
                       explain: Callable[[int, HypuraError], HypuraError] | None = None) -> Plan:
    """The plan for an unset context: at the minimum, then larger while that costs no weight a faster tier
    and little decode (grow_context). plan_at(n_ctx) makes a plan; explain(n_ctx, error): the error to raise
    when none fits at the minimum."""
    contexts = contexts_for(header, min_ctx)
    try:
        plan = plan_at(contexts[-1])
    except HypuraError as e:
        if explain is not None:
            raise explain(contexts[-1], e) from None
        raise HypuraError(f"{e}; at context {contexts[-1]}, the smallest an unset context gets (-c or --fit-ctx "
                          "gives another)") from None
    return grow_context(plan, plan_at, contexts[:-1])


@dataclass(frozen=True)
class Caps:
    """What the default path gives the planner: the free memory less the margins (bytes)."""

    gpu: int
    ram: int


def free_caps(free: FreeMemory, fit: Fit, on_gpu: bool) -> tuple[int, int]:
    """(GPU bytes, RAM bytes) the default path may use: the free memory less the margins."""
    return max(0, (free.gpu or 0) - fit.gpu_margin) if on_gpu else 0, max(0, free.ram - fit.ram_margin)


def fits_in_order(fit: Fit) -> list[Fit]:
    """The memory the default path tries, in order (module docstring, step 3): the free memory less the margins,
    then, where nothing fits there, the free RAM itself. The server's room for a model follows the same order."""
    return [fit] + ([dataclasses.replace(fit, ram_margin=0)] if fit.ram_margin else [])


def fits_free(need: tuple[int, int], free: FreeMemory, fit: Fit, on_gpu: bool) -> bool:
    """(GPU bytes, RAM bytes) that llama.cpp's placement takes fit the free memory less the margins."""
    gpu_cap, ram_cap = free_caps(free, fit, on_gpu)
    return need[0] <= gpu_cap and need[1] <= ram_cap


def default_path(header, n_ctx: int, n_ubatch: int, use_gpu: bool, fit: Fit, free: FreeMemory, unified: bool,
                 profile: Callable[[], object], plan_within: Callable[[object, Caps, int], Plan],
                 always_plan: bool = False,
                 reserve: Callable[[int], tuple[int, int]] = lambda n_ctx: (0, 0),
                 finish: Callable[[Plan], Plan] = lambda plan: plan) -> tuple[Plan | None, int, str, bool]:
    """The default path's (plan, context, line, fits) for `header` (module docstring); n_ctx 0: unset; fits:
    llama.cpp's placement fits. plan_within(profile, budgets, n_ctx) makes a plan; profile() is called only where
    the model does not fit (a first use measures one). always_plan: the plan within the free memory even where
    llama.cpp's placement fits. reserve(n_ctx): (GPU, RAM) bytes a model beside this one holds at that context
    beside llama.cpp's placement (a plan_within keeps its own room for it). finish(plan): the plan made at the
    context chosen, as it will run (the decision's micro-batch).

    Where nothing fits the RAM less its margin, the free RAM itself is tried, the line saying so: a model
    llama_cpp.Llama runs in what is free loads, never refused for a margin of Hypura's own."""
    args = (header, n_ctx, n_ubatch, use_gpu)
    rest = (free, unified, profile, plan_within, always_plan, reserve, finish)
    first, *then = fits_in_order(fit)
    try:
        return _default_path(*args, first, *rest)
    except HypuraError as refused:
        if not then:
            raise
        try:
            plan, c, line, fits = _default_path(*args, then[0], *rest)
        except HypuraError:
            raise refused from None  # it says the margin the user can change
    return plan, c, (f"{line}; below the {fmt_size(fit.ram_margin)} RAM margin the default path keeps free: "
                     "other programs' memory may be paged out"), fits


def _default_path(header, n_ctx: int, n_ubatch: int, use_gpu: bool, fit: Fit, free: FreeMemory, unified: bool,
                  profile: Callable[[], object], plan_within: Callable[[object, Caps, int], Plan],
                  always_plan: bool, reserve: Callable[[int], tuple[int, int]],
                  finish: Callable[[Plan], Plan]) -> tuple[Plan | None, int, str, bool]:
    m = _Model(header, n_ubatch)
    on_gpu = use_gpu and free.gpu is not None
    gpu_cap, ram_cap = free_caps(free, fit, on_gpu)
    margins = (f"less margins of {fmt_size(fit.gpu_margin)} GPU, {fmt_size(fit.ram_margin)} RAM" if on_gpu
               else f"less a {fmt_size(fit.ram_margin)} margin" if fit.ram_margin else "with no margin")
    contexts = [n_ctx] if n_ctx > 0 else m.contexts(fit.min_ctx)
    for c in contexts:
        gpu, ram = (a + b for a, b in zip(m.resident_need(c, on_gpu, unified), reserve(c)))
        if fits_free((gpu, ram), free, fit, on_gpu):
            where = "every layer on the GPU" if on_gpu else "in RAM"
            line = (f"hypura: fits: llama.cpp's placement ({where}), context {c}"
                    + ("" if n_ctx or c == m.n_train else f" (training context {m.n_train} does not fit)")
                    + f"; needs {fmt_size(gpu + ram)} of {free.describe()} {margins}")
            plan = finish(plan_within(profile(), Caps(gpu_cap if on_gpu else 0, ram_cap), c)) if always_plan else None
            return plan, c, line, True

    machine = profile()
    caps = Caps(gpu_cap if on_gpu and machine.gpu is not None else 0, ram_cap)
    plan_at = lambda c: plan_within(machine, caps, c)  # noqa: E731
    explain = lambda c, e: _explain(e, c, m, free, caps, margins, explicit=n_ctx > 0)  # noqa: E731
    if n_ctx > 0:
        try:
            plan = plan_at(n_ctx)
        except HypuraError as e:
            raise explain(n_ctx, e) from None
        note = _ctx_note(plan, plan_at, n_ctx)
    else:
        plan = plan_unset_context(plan_at, header, fit.min_ctx, explain)
        note = "" if plan.n_ctx == m.n_train else f" (training context {m.n_train}: more would slow decode or not fit)"
    plan = finish(plan)
    why = (f"needs {fmt_size(sum(m.resident_need(plan.n_ctx, on_gpu, unified)))} as llama.cpp would hold it, "
           f"{free.describe()} {margins}") + _disk_note(plan, machine)
    return plan, plan.n_ctx, f"hypura: plan: {summary(plan)}{note}; why: {why}", False


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


def summary(plan: Plan) -> str:
    """Tiers, context and KV, the prediction and its limiting link: the plan in one phrase."""
    w = plan.bytes_by_tier()
    tiers = ", ".join(f"{t} {fmt_size(w[t])}" for t in (GPU, RAM, DISK) if w[t])
    pr = plan.prediction
    # a plan for several sequences serves one too (a server's lone client): both predictions
    many = (f" for {pr.parallel} sequences together, {plan.one_decode_tok_s:.2f} for one alone"
            if pr.parallel > 1 and plan.one_decode_tok_s else "")
    return (f"weights {tiers}; context {plan.n_ctx} (KV {fmt_size(plan.kv_bytes)} in {plan.kv_tier}); "
            f"predicts decode {pr.decode_tok_s:.2f} tok/s{many}, limited by {pr.decode_limit}"
            + (f"; {plan.why}" if plan.why else ""))


def _explain(e: HypuraError, n_ctx: int, m: _Model, free: FreeMemory, caps: Caps, margins: str,
             explicit: bool) -> HypuraError:
    """A context no plan fits, in one line: what the tier lacks, without the planner's model and budget totals
    (the free memory follows)."""
    detail = str(e).removeprefix("no placement fits: ").split("; model weights")[0]
    has = f"{free.describe()} {margins}"
    room = caps.gpu + caps.ram
    if explicit and m.kv(n_ctx) > room:
        return HypuraError(f"-c {n_ctx}: its KV cache ({fmt_size(m.kv(n_ctx))}) does not fit in the free memory "
                           f"({fmt_size(room)}: {has}); the largest context that could is about "
                           f"{max(0, room - m.buf - m.host_only) // max(1, m.kv(1))}")
    return HypuraError(f"not enough free memory to run {Path(m.header.path).name} at context {n_ctx}, even "
                       f"streaming from disk: {detail}; this machine has {has}")


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


def resident_need(header, n_ctx: int, n_ubatch: int, on_gpu: bool, unified: bool) -> tuple[int, int]:
    """(GPU bytes, RAM bytes) the model takes as llama.cpp would hold it at n_ctx (0: the smallest unset
    context), every layer on the GPU when on_gpu, else in RAM: what the default path checks against the free
    memory (a server's room)."""
    m = _Model(header, n_ubatch)
    return m.resident_need(n_ctx or m.contexts(MIN_CTX)[-1], on_gpu, unified)


__all__ = ["CTX_DECODE_TOLERANCE", "Caps", "Fit", "MIN_CTX", "contexts_for", "default_path",
           "fits_free", "free_caps", "grow_context", "plan_unset_context", "resident_need", "summary"]
