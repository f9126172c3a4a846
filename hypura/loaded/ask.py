"""What a load is asked for: llama-cpp-python's `Llama` keywords (their names, defaults and meaning) and
Hypura's own (placement, budgets, plan, the draft kept beside); hypura.Llama's docstring says what each does."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Union

from hypura.plan.auto import Fit


@dataclass(frozen=True)
class LoadAsk:
    llama: dict = field(default_factory=dict)  # llama_cpp.Llama's keywords (n_ctx, n_gpu_layers, n_threads, ...)
    override_tensor: Union[str, Iterable[str], None] = None
    placement_policy: Optional[Callable] = None
    gpu_mem: Union[int, str, None] = None
    ram: Union[int, str, None] = None
    plan: object = None  # a Plan, a plan file, or "auto"
    param_overrides: Optional[dict] = None  # {"model_params": {...}, "context_params": {...}}
    on_route: Optional[Callable] = None
    expert_cache: object = None  # ExpertCacheSettings or slots per layer
    fit: Union[Fit, bool] = True
    profile: object = None  # a MachineProfile (default: the cached one)
    draft_beside: Union[str, os.PathLike, object, None] = None  # a draft GGUF whose memory the decision keeps; "auto"
    rpc_servers: Union[str, Iterable[str], None] = None
    devices: Optional[Iterable[str]] = None
    rpc_mem: Optional[Iterable[Union[int, str]]] = None
    split: bool = False
    parallel: int = 1  # sequences decoded together: the plan's step, llama.cpp's n_seq_max (hypura.plan.load_params)
    spare_seqs: int = 0  # sequence ids beside them that decode nothing in a step (the engine's embeddings)

    @classmethod
    def of(cls, **kwargs) -> "LoadAsk":
        """Hypura's keywords by name, the rest llama_cpp.Llama's (an unknown one raises TypeError at the load)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"llama"}
        return cls(llama={k: v for k, v in kwargs.items() if k not in names},
                   **{k: v for k, v in kwargs.items() if k in names})
