"""Placement planning: which tier (gpu | ram | disk) every tensor and expert lives in.

    from hypura.profile import machine_profile   # cached profile of this machine, else a quick one
    plan = plan_model("model.gguf", machine_profile(), gpu_mem="8GiB", ram="32GiB")
    plan.placement("blk.3.ffn_up.weight").tier      # what the loader hook asks

    make.py          plan_model: a model planned for a machine within budgets
    ask.py           Ask: the one load request every front end makes and decide() reads (DeviceAsk: its devices)
    decision.py      decide(): the one decision every front end applies before llama.cpp loads a model
    auto.py          the default path: placement and context from the free memory, as llama.cpp's --fit
    kv_cells.py      the cells of a cache the sequences share (serve -kvu): how many, weighed against the weights
    beside.py        a model kept resident beside the planned one (a draft): its room, on the GPU or in RAM
    load_params.py   llama.cpp's model and context parameters from the decision, with no I/O
    budget.py        budgets and rates from a profile, less the margins, with the user's overrides
    knobs.py         every tuning constant, with where its number comes from
    cost.py          the cost model: bytes moved per path -> predicted tok/s
    steps.py         a step's path through a placement, its prediction, a chat turn's time
    unit_sums.py     the search's sums over every unit of a placement at once
    model_orders.py  what the search needs of the model alone, made once for all its problems
    solve.py         the placement search: exact for the cost model's structure, and a greedy baseline
    staging.py       the RAM staging disk units need (disk slots, paged experts), as the runtime lays it out
    search.py        the candidates searched; the smallest RAM budget that plans a model where none fits
    candidates.py    which candidate is kept: llama.cpp's kind of placement unless streaming clearly gains
    experts.py       the expert-cache alternative for an MoE plan
    microbatch.py    a prompt's micro-batch (n_ubatch): as large as pays, or small enough that paged experts fit
    shares.py        a model's layers split over several devices (GPUs, RPC servers) and the host
    split.py         when the decision splits a model over several devices, over what, within which budgets
    pools.py         how non-resident tensors move: whole through a pool's slots, or expert by expert
    expected.py      what a plan's prediction assumes, beside it: each tier's share of expert reads, the bound
    latest.py        Latest: the value last made of some inputs, per thread, made again only for others
    plan.py          Plan: every tensor's (and expert's) place, frozen and JSON-serialisable
    report.py        plans and profiles as text a person reads
"""

from hypura.plan.budget import Budgets, RateOverrides, budgets_for, fmt_size, parse_size, rates_for
from hypura.plan.cost import Prediction, Rates, Traffic, predict, traffic
from hypura.plan.make import SOLVERS, plan_model
from hypura.plan.plan import Plan, TensorPlacement
from hypura.plan.search import greedy, optimize
from hypura.plan.solve import PlanSettings
from hypura.units import ModelUnits, model_units

__all__ = ["Budgets", "ModelUnits", "Plan", "PlanSettings", "Prediction", "RateOverrides", "Rates", "SOLVERS",
           "TensorPlacement", "Traffic", "budgets_for", "fmt_size", "greedy", "model_units", "optimize",
           "parse_size", "plan_model", "predict", "rates_for", "traffic"]
