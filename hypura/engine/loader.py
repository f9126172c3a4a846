"""One way to make a Llama for the engine, and the engine on it (the server and `hypura bench --parallel`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import llama_cpp

from hypura.engine.config import EngineConfig
from hypura.engine.engine import Engine
from hypura.errors import HypuraError


def engine_llama_kwargs(parallel: int, n_ctx_per_seq: int, model_path: str | os.PathLike | None = None,
                        **kwargs) -> dict:
    """hypura.Llama keywords for `parallel` sequences of `n_ctx_per_seq` tokens each: one unified KV cache
    of parallel x n_ctx_per_seq cells (sequences copy a shared prefix's cells instead of recomputing it),
    n_seq_max = parallel, and flash attention unless asked otherwise (llama.cpp's default, "auto"): its CPU
    kernel leaves a sequence's attention independent of the others in the batch (docs/engine.md).

    gpu_mem/ram budgets without a plan: the plan is made here, for steps of `parallel` tokens (needs
    model_path). A plan that turns llama.cpp's op offload off gets it off. Neither: every layer offered to
    the GPU (n_gpu_layers=-1, as llama-server and Ollama serve), and hypura.Llama's default path fits the
    model to the free memory or plans it there."""
    if "n_ctx" in kwargs:
        raise HypuraError("give n_ctx_per_seq: the context is parallel x n_ctx_per_seq tokens")
    overrides = {name: dict(fields) for name, fields in (kwargs.pop("param_overrides", None) or {}).items()}
    context = overrides.setdefault("context_params", {})
    context.setdefault("kv_unified", True)
    # one spare sequence id for embeddings (engine/embed.py): in a unified cache it costs no memory
    context.setdefault("n_seq_max", parallel + 1 if context["kv_unified"] else parallel)
    budgets = {k: kwargs.pop(k) for k in ("gpu_mem", "ram") if kwargs.get(k) is not None}
    if budgets and kwargs.get("plan") is None:
        if model_path is None:
            raise HypuraError("budgets for the engine need the model's path to plan it")
        kwargs["plan"] = plan_for_parallel(model_path, parallel, parallel * n_ctx_per_seq,
                                           kwargs.get("n_ubatch", DEFAULT_N_UBATCH), **budgets)
    elif budgets:
        kwargs.update(budgets)  # hypura.Llama refuses a plan with budgets: one clear error, its own
    plan = _as_plan(kwargs.get("plan"))
    if plan is not None and not plan.traffic.op_offload:
        context.setdefault("op_offload", False)
    if "flash_attn" not in kwargs:
        context.setdefault("flash_attn_type", llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO)
    if kwargs.get("n_threads") and not kwargs.get("n_threads_batch"):
        # llama-server's -tb default: -t (llama-cpp-python's would be every logical CPU, which every step of
        # several tokens, i.e. each step of several sequences, then uses)
        kwargs["n_threads_batch"] = kwargs["n_threads"]
    kwargs.setdefault("n_gpu_layers", -1)  # a server's default: hypura.Llama's own stays llama-cpp-python's CPU
    kwargs.setdefault("verbose", False)
    return dict(kwargs, n_ctx=parallel * n_ctx_per_seq, param_overrides=overrides)


DEFAULT_N_UBATCH = 512  # llama-cpp-python's Llama default, the micro-batch a plan budgets for


def plan_for_parallel(model_path: str | os.PathLike, parallel: int, n_ctx: int, n_ubatch: int = DEFAULT_N_UBATCH,
                      gpu_mem=None, ram=None):
    """The plan hypura.Llama would make from these budgets (this machine's profile, recorded routing),
    with decode steps of `parallel` tokens in its cost model."""
    from hypura.modelfile import read_header
    from hypura.plan import PlanSettings
    from hypura.profile.measure import planning_profile
    from hypura.runtime.plan_policy import plan_with_routing

    settings = PlanSettings(n_ctx=n_ctx, n_ubatch=n_ubatch, parallel=parallel)
    return plan_with_routing(read_header(model_path), planning_profile(model_path), gpu_mem=gpu_mem, ram=ram,
                             settings=settings)


def _as_plan(spec):
    from hypura.plan import Plan

    if isinstance(spec, Plan):
        return spec
    return Plan.load(spec) if spec is not None and str(spec) != "auto" else None


def load(model_path: str | os.PathLike, parallel: int = 4, n_ctx_per_seq: int = 4096,
         config: Optional[EngineConfig] = None, **llama_kwargs):
    """Load `model_path` as hypura.Llama (llama-cpp-python's keywords plus Hypura's: plan, gpu_mem, ram, ...)
    for `parallel` sequences of `n_ctx_per_seq` tokens, and start an Engine on it. Returns (llm, engine);
    close the engine, then the Llama."""
    from hypura import Llama

    config = dataclasses.replace(config, parallel=parallel) if config else EngineConfig(parallel=parallel)
    llm = Llama(str(model_path), **engine_llama_kwargs(parallel, n_ctx_per_seq, model_path, **llama_kwargs))
    try:
        engine = Engine(llm, config).start()
    except BaseException:
        llm.close()
        raise
    return llm, engine
