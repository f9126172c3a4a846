"""`load(path, ask)`: the one way Hypura loads a model: the model file checked, the request filled once, the RPC
servers registered, the one decision made (hypura.plan.decision: the plan, the devices and their split; a draft
found in the stores where asked), the Runtime built over it, then llama.cpp's model and context loaded through its
hooks, with llama-cpp-python's keywords and Hypura's fields set over llama.cpp's params structs. Nothing is decided
here: what the decision chose is applied."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import sys
from typing import Optional

import llama_cpp
from llama_cpp.llama import set_verbose

from hypura.bindings.ffi import ffi, lib
from hypura.bindings.llama_params import context_params, llama_keywords, model_params, set_fields
from hypura.bindings.llama_log import LogCapture
from hypura.bindings.model import load_model, new_context
from hypura.errors import HypuraError
from hypura.loaded.context import Context, RuntimeContext
from hypura.loaded.model import LoadedModel
from hypura.modelfile import read_header
from hypura.plan.beside import Beside
from hypura.plan.decision import Ask, Decision, Routing, decide
from hypura.plan.microbatch import outputs_needed
from hypura.runtime.device_list import device_array, measure as measure_devices, register as register_devices
from hypura.runtime.moe.expert_streaming import ExpertCacheSettings
from hypura.runtime.overrides import overrides_policy
from hypura.runtime.runtime import Runtime, as_model_pointer
from hypura.speculative.auto_draft import AutoDraft, find_draft, is_auto
from hypura.store import resolve_path


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def load(path, ask: Ask = Ask()) -> LoadedModel:
    """Load `path` (or a model named as Ollama names it, from the stores hypura.store searches) as `ask` says.
    Raises ModelFileError (a ValueError) for a missing, non-GGUF, truncated or unsupported file before llama.cpp
    reads it, HypuraError for a placement that cannot be, TypeError for a keyword llama_cpp.Llama does not take."""
    path = str(resolve_path(path))
    k = llama_keywords(path, dict(ask.llama))
    header = read_header(path, bool(k["vocab_only"]))  # the vocabulary alone: no weight to place
    lib()  # fail clearly now if the library lacks the hooks
    ask = filled(ask, k)
    say = ask.fit.say or (_stderr if k["verbose"] else None)
    rpc = register_devices(ask.devices, ask.fit.say)  # llama.cpp's device registry: RPC servers probed as added
    decision, found = _decide(path, header, ask, rpc, say)
    # the load's own copies of llama-cpp-python's keywords and the params fields, with what the decision chose
    k, overrides = dict(ask.llama), {name: dict(fields) for name, fields in ask.param_overrides.items()}
    if decision.shares is not None:  # the split: llama.cpp's layer split over the devices, as llama-completion's flags
        k.update(decision.split_fields())
        overrides.setdefault("model_params", {})["n_gpu_layers"] = decision.shares.n_gpu_layers
        overrides.setdefault("context_params", {})["n_ctx"] = decision.shares.n_ctx
    k.update(decision.params.keywords())  # the context, its batches and the threads (hypura.plan.load_params)
    context = overrides.setdefault("context_params", {})
    if "n_ctx" in context:
        context["n_ctx"] = decision.n_ctx
    expert_cache = ask.expert_cache
    if isinstance(expert_cache, int):
        expert_cache = ExpertCacheSettings(slots=expert_cache)
    runtime = Runtime(header, path, decision.plan, ask.placement_policy or overrides_policy(ask.override_tensor),
                      decision.params, overrides, expert_cache, ask.on_route)
    if runtime.reads is not None and say is not None:
        say(runtime.reads.line)
    stack = contextlib.ExitStack()  # llama.cpp's model and context
    runtime.own(stack.close)  # first at close: before the layer stream and expert caches
    try:
        with runtime.loading() as hooks:
            loaded = _load(path, header, k, stack, runtime, decision, runtime.params.merged())
        loaded.draft_found = found
        loaded.placement = {name: p for name, (_, p) in hooks.placed.items()}
        runtime.attach(as_model_pointer(loaded.model.model))
        if runtime.mapped is not None and say is not None:
            say(runtime.mapped.stats.line)
        _load_lora(loaded)
    except BaseException:
        runtime.close()  # the model, context and streams go with the failed load
        raise
    return loaded


def filled(ask: Ask, k: dict) -> Ask:
    """`ask` filled once: llama-cpp-python's keywords with their defaults (`k`, llama_keywords'), the params
    fields copied (never the caller's), and the llama.cpp values the decision reads, from them."""
    if ask.param_overrides is not None and not isinstance(ask.param_overrides, dict):
        raise HypuraError("param_overrides takes a dict: {\"model_params\": {...}, \"context_params\": {...}}")
    if ask.placement_policy is not None and ask.override_tensor is not None:
        raise HypuraError("give one of plan (or gpu_mem/ram budgets), placement_policy and override_tensor")
    overrides = {name: dict(fields) for name, fields in (ask.param_overrides or {}).items()}
    model, context = overrides.get("model_params", {}), overrides.get("context_params", {})
    # every row where llama-cpp-python's logits_all, embeddings or a draft verified in the pass read them
    outputs = outputs_needed(context, bool(k["logits_all"] or k["embedding"] or k["draft_model"] is not None),
                             ask.parallel + ask.spare_seqs)
    layer_split = model.get("split_mode", k["split_mode"]) == llama_cpp.LLAMA_SPLIT_MODE_LAYER
    return dataclasses.replace(
        ask, llama=k, param_overrides=overrides, n_ctx=context.get("n_ctx", k["n_ctx"]) or 0,
        n_ubatch=context.get("n_ubatch", k["n_ubatch"]), n_batch=context.get("n_batch", k["n_batch"]),
        n_threads=k["n_threads"], n_threads_batch=k["n_threads_batch"],
        n_gpu_layers=model.get("n_gpu_layers", k["n_gpu_layers"]), n_outputs=outputs,
        placement=ask.placement_policy is not None or ask.override_tensor is not None,
        # llama.cpp's placement of no weights: nothing to fit
        fit=dataclasses.replace(ask.fit, enabled=False) if k["vocab_only"] else ask.fit,
        devices=dataclasses.replace(ask.devices, tensor_split=k["tensor_split"] is not None, layer_split=layer_split))


def _decide(path: str, header, ask: Ask, rpc: tuple[str, ...], say) -> tuple[Decision, object]:
    """The one decision (hypura.plan.decision) and the draft found for it (None unless one was asked for and
    kept); its line said where verbose."""
    from hypura.profile.free import free_memory
    from hypura.profile.measure import planning_profile
    from hypura.runtime.moe.coactivation import routing_frequencies

    # the machine profile, read (or measured) once, when first asked
    machine = ask.profile or functools.cache(lambda: planning_profile(path, say, measure=ask.fit.measure_profile))
    measured = functools.cache(lambda: measure_devices(rpc))  # only where a split is planned, once

    def decide_beside(beside: Optional[Beside]) -> Decision:
        return decide(header, dataclasses.replace(ask, beside=beside), lambda: ask.fit.free or free_memory(),
                      machine, routing=lambda: Routing(*routing_frequencies(header)), devices=measured)

    draft, found_path = ask.draft_beside, None
    if is_auto(draft):  # a draft from the stores, planned beside; kept where the cost model predicts a gain
        decision = decide_beside(None)
        found = find_draft(header, decision, decide_beside, draft if isinstance(draft, AutoDraft) else AutoDraft(),
                           ask.n_ubatch)
        if found is not None:
            decision, found_path = found.decision, found.path
            if say is not None:
                say(found.line())
    else:
        decision = decide_beside(Beside.of(read_header(draft), ask.n_ubatch) if draft else None)
    if decision.line and say is not None:
        say(decision.line)
    return decision, found_path


def _load(path: str, header, k: dict, stack: contextlib.ExitStack, runtime: Runtime, decision: Decision,
          fields: dict) -> LoadedModel:
    """llama.cpp's model and context, built as llama_cpp.Llama builds them from keywords `k`, with Hypura's
    `fields` set over its params structs (hypura.runtime.params), owned by `stack`."""
    set_verbose(k["verbose"])  # llama-cpp-python's log callback: llama.cpp's log on stderr where verbose
    numa = k["numa"] if not isinstance(k["numa"], bool) else (
        llama_cpp.GGML_NUMA_STRATEGY_DISTRIBUTE if k["numa"] else llama_cpp.GGML_NUMA_STRATEGY_DISABLED)
    if numa != llama_cpp.GGML_NUMA_STRATEGY_DISABLED:
        llama_cpp.llama_numa_init(numa)
    arrays = model_params(k)  # the struct and the arrays it points into, alive as long as the model
    devices = device_array(decision.devices)  # alive as long as the params that point at it
    if devices is not None:
        arrays.params.devices = int(ffi.cast("uintptr_t", devices))
    set_fields(arrays.params, fields["model_params"])
    log = LogCapture()  # llama.cpp says why a load failed only in its log
    try:
        with log:
            model = load_model(stack, path, arrays.params, k["verbose"])
            cparams = context_params(k, model.n_ctx_train())
            set_fields(cparams, fields["context_params"])
            owner = new_context(stack, model, cparams, k["verbose"], RuntimeContext, runtime=runtime)
        log.replay()
    except Exception as e:
        clearer = log.failure(e, path)
        if clearer is not None:
            raise clearer from None
        raise
    return LoadedModel(path, header, k, runtime, stack, model, Context(owner, model.n_vocab()), arrays,
                       (devices,), cparams, decision)


def _load_lora(loaded: LoadedModel) -> None:
    """llama-cpp-python's lora_path and lora_scale: the adapter set on the context, freed first at close."""
    k = loaded.keywords
    if not k["lora_path"]:
        return
    adapter = llama_cpp.llama_adapter_lora_init(loaded.model.model, k["lora_path"].encode("utf-8"))
    if adapter is None:
        raise RuntimeError(f"Failed to initialize LoRA adapter from lora path: {k['lora_path']}")
    loaded.own(lambda: llama_cpp.llama_adapter_lora_free(adapter))
    loaded.lora_adapter = adapter
    adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter)
    if llama_cpp.llama_set_adapters_lora(loaded.context.ctx, adapters, 1, (ctypes.c_float * 1)(k["lora_scale"])):
        raise RuntimeError(f"Failed to set LoRA adapter from lora path: {k['lora_path']}")
