"""What a load is asked for (`Ask`, with its devices, `DeviceAsk`, and the planner's own settings): the one request
every front end makes and the one decision (decision.py) answers."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Union

from hypura.errors import HypuraError
from hypura.plan import knobs
from hypura.plan.auto import Fit
from hypura.plan.beside import Beside
from hypura.plan.budget import RateOverrides
from hypura.plan.microbatch import outputs_needed
from hypura.plan.plan import Plan
from hypura.sizes import parse_size

# llama-cpp-python's default n_batch (llama_cpp.Llama's keyword)
N_BATCH = 512


@dataclass(frozen=True)
class Planner:
    """The planner's own settings (`hypura inspect`'s flags); the defaults are what every run plans with."""

    kv_bytes_per_element: float = knobs.KV_BYTES_PER_ELEMENT
    prefetch_depth: int = knobs.PREFETCH_DEPTH
    disk: bool = True  # False: never stream from disk
    overrides: RateOverrides = RateOverrides()
    solver: str = "optimizer"


@dataclass(frozen=True)
class DeviceAsk:
    """The devices asked for: RPC servers (llama-cpp-python's `rpc_servers`, "host:port,..."), llama.cpp's `--device`
    names ("none": nothing offloaded), a budget per RPC device, and `split`: the split over this machine's GPUs too
    where no RPC server is given (several GPUs; without it they load as one). Nothing given: llama.cpp's default
    devices (the one-GPU path)."""

    rpc_servers: Union[str, tuple[str, ...], None] = None
    names: Optional[tuple[str, ...]] = None  # --device
    rpc_mem: Optional[tuple[int, ...]] = None
    split: bool = False
    tensor_split: bool = False  # llama.cpp's -ts given: its split stands
    layer_split: bool = True  # llama.cpp's -sm layer, the split Hypura plans (row or none: as given)
    disk: bool = False  # the host's layers may stream from disk: planned (inspect), not loaded yet

    @classmethod
    def of(cls, rpc_servers=None, names: Optional[Iterable[str]] = None,
           rpc_mem: Union[str, Iterable[Union[int, str]], None] = None, **rest) -> "DeviceAsk":
        """Sizes parsed ("2GiB,1GiB" or a list), lists made tuples."""
        if isinstance(rpc_mem, str):
            rpc_mem = rpc_mem.split(",")
        return cls(rpc_servers if isinstance(rpc_servers, (str, type(None))) else tuple(rpc_servers),
                   None if names is None else tuple(names),
                   tuple(parse_size(m) for m in rpc_mem) if rpc_mem else None, **rest)

    @property
    def given(self) -> bool:
        return bool(self.rpc_servers) or self.names is not None or self.split


@dataclass(frozen=True)
class Ask:
    """What a load is asked for: one request, made by each front end (hypura.Llama, hypura-cli, hypura serve and
    bench through `Ask.of`; `hypura inspect` and `list --plan` with llama.cpp's values given) and carried unchanged
    to the one decision (decision.py). `Ask.of`, the constructor a load takes, fills it once: llama-cpp-python's
    defaults into `llama`, and from them and `param_overrides` the llama.cpp values the decision reads."""

    # llama-cpp-python's `Llama` keywords (n_ctx, n_gpu_layers, n_threads, ...; an unknown one raises TypeError in
    # Ask.of), and Hypura's own (hypura.Llama's docstring says what each does)
    llama: Mapping[str, object] = field(default_factory=dict)
    plan: Union[Plan, str, os.PathLike, None] = None  # a Plan, a plan file, or "auto"
    gpu_mem: Union[int, str, None] = None  # budgets: a plan is made within them ("SIZE,SIZE": each GPU's, split)
    ram: Union[int, str, None] = None
    placement_policy: Optional[Callable] = None  # TensorInfo -> Placement (hypura.runtime.placement)
    override_tensor: Union[str, Iterable[str], None] = None  # llama.cpp's -ot
    expert_cache: object = None  # an expert cache: ExpertCacheSettings or slots per layer; llama.cpp places the rest
    on_route: Optional[Callable] = None  # MoE: called with each layer's chosen experts
    profile: object = None  # the MachineProfile plans are made with (None: this machine's, read where needed)
    draft_beside: Union[str, os.PathLike, object, None] = None  # a draft GGUF loaded beside ("auto": one found)
    devices: DeviceAsk = DeviceAsk()
    fit: Fit = Fit()  # True/False: Fit() on or off
    # sequences decoded together (the engine's batch, a draft tree's branches): a plan is made for steps of
    # that many tokens, and llama.cpp's context holds that many sequence ids
    parallel: int = 1
    spare_seqs: int = 0  # sequence ids beyond `parallel` that decode nothing in a step (the engine's embeddings)
    # the `parallel` sequences share the cache's cells (serve -kvu): n_ctx is the most, the decision chooses how
    # many (plan/kv_cells.py)
    kv_cells: bool = False
    # llama.cpp's params fields the caller set ({"model_params": {...}, "context_params": {...}}): they stand,
    # except where they contradict what a plan needs (load_params.py)
    param_overrides: Optional[Mapping[str, Mapping[str, object]]] = field(default_factory=dict)

    # llama.cpp's values the decision reads (Ask.of fills them from `llama` and `param_overrides`)
    n_ctx: int = 0  # 0: unset (chosen here)
    n_ubatch: int = knobs.N_UBATCH
    n_batch: int = N_BATCH
    n_threads: Optional[int] = None  # None: chosen (load_params.py)
    n_threads_batch: Optional[int] = None
    n_gpu_layers: int = -1  # 0: the CPU computes; -1: every layer offered to the GPU; N: llama.cpp's placement
    # the logits rows a step reads at most (plan/microbatch.py outputs_needed; 0: every token): a micro-batch the
    # decision grows computes no more (llama.cpp's n_outputs_max), and the plan counts its compute buffer so
    n_outputs: int = 0
    placement: bool = False  # a placement policy or -ot overrides: llama.cpp's placement, refused beside a plan

    planner: Planner = Planner()
    always_plan: bool = False  # `hypura inspect`: the plan within the free memory even where the model fits
    beside: Optional[Beside] = None  # a draft loaded beside: its memory is reserved within the budgets

    def __post_init__(self):
        if isinstance(self.fit, bool):
            object.__setattr__(self, "fit", Fit(enabled=self.fit))

    @classmethod
    def of(cls, **kwargs) -> "Ask":
        """The request a load takes, filled once (_filled): Hypura's keywords by name (the devices' as hypura.Llama
        takes them: rpc_servers, devices, rpc_mem, split), the rest llama_cpp.Llama's (TypeError for one it does
        not take, as llama_cpp.Llama raises)."""
        device = {name: kwargs.pop(name) for name in _DEVICE_KEYWORDS if name in kwargs}
        if device:
            kwargs["devices"] = DeviceAsk.of(device.get("rpc_servers"), device.get("devices"), device.get("rpc_mem"),
                                             split=bool(device.get("split")))
        return _filled(cls(llama={k: v for k, v in kwargs.items() if k not in _KEYWORDS},
                           **{k: v for k, v in kwargs.items() if k in _KEYWORDS}))


def _filled(ask: Ask) -> Ask:
    """`ask` filled once: llama-cpp-python's keywords with their defaults, the params fields copied (never the
    caller's), and from them the llama.cpp values the decision reads."""
    from hypura.bindings.llama_params import LLAMA_SPLIT_MODE_LAYER, llama_keywords  # llama_cpp: only for a load

    if ask.param_overrides is not None and not isinstance(ask.param_overrides, dict):
        raise HypuraError("param_overrides takes a dict: {\"model_params\": {...}, \"context_params\": {...}}")
    if ask.placement_policy is not None and ask.override_tensor is not None:
        raise HypuraError("give one of plan (or gpu_mem/ram budgets), placement_policy and override_tensor")
    k = llama_keywords("", dict(ask.llama))  # the model's path is the load's
    overrides = {name: dict(fields) for name, fields in (ask.param_overrides or {}).items()}
    model, context = overrides.get("model_params", {}), overrides.get("context_params", {})
    # every row where llama-cpp-python's logits_all, embeddings or a draft verified in the pass read them
    outputs = outputs_needed(context, bool(k["logits_all"] or k["embedding"] or k["draft_model"] is not None),
                             ask.parallel + ask.spare_seqs)
    layer_split = model.get("split_mode", k["split_mode"]) == LLAMA_SPLIT_MODE_LAYER
    return dataclasses.replace(
        ask, llama=k, param_overrides=overrides, n_ctx=context.get("n_ctx", k["n_ctx"]) or 0,
        n_ubatch=context.get("n_ubatch", k["n_ubatch"]), n_batch=context.get("n_batch", k["n_batch"]),
        n_threads=k["n_threads"], n_threads_batch=k["n_threads_batch"],
        n_gpu_layers=model.get("n_gpu_layers", k["n_gpu_layers"]), n_outputs=outputs,
        placement=ask.placement_policy is not None or ask.override_tensor is not None,
        # llama.cpp's placement of no weights: nothing to fit
        fit=dataclasses.replace(ask.fit, enabled=False) if k["vocab_only"] else ask.fit,
        devices=dataclasses.replace(ask.devices, tensor_split=k["tensor_split"] is not None, layer_split=layer_split))


_DEVICE_KEYWORDS = ("rpc_servers", "devices", "rpc_mem", "split")
_KEYWORDS = frozenset(("plan", "gpu_mem", "ram", "placement_policy", "override_tensor", "expert_cache", "on_route",
                       "profile", "draft_beside", "devices", "fit", "parallel", "spare_seqs", "kv_cells",
                       "param_overrides"))
