"""`load(path, ask)`: the one way Hypura loads a model: the model file checked, the RPC servers registered, the one
decision made for the request (Ask.of's, filled there once) with this machine measured where it needs (measured.py)
(hypura.plan.decision: the plan, the devices and their split, all llama.cpp is handed; a draft found in the stores
where asked), the Runtime built over it, then llama.cpp's model and context loaded through its hooks, with the
decision's keywords and fields set over llama.cpp's params structs. Nothing is decided here: the decision is
applied."""

from __future__ import annotations

import contextlib
import dataclasses
import ctypes
import sys
from typing import Optional

import llama_cpp
from llama_cpp.llama import set_verbose

from hypura.bindings.ffi import ffi, lib
from hypura.bindings.llama_params import context_params, model_params, set_fields
from hypura.bindings.llama_log import LogCapture
from hypura.bindings.model import load_model, new_context
from hypura.errors import HypuraError
from hypura.loaded.context import Context, RuntimeContext
from hypura.loaded.measured import Measured
from hypura.loaded.model import LoadedModel
from hypura.modelfile import read_header
from hypura.plan.beside import Beside
from hypura.plan.decision import Ask, Decision, decide
from hypura.runtime.device_list import device_array, register as register_devices
from hypura.runtime.runtime import Runtime, as_model_pointer
from hypura.speculative.auto_draft import find_draft, is_auto
from hypura.store import resolve_path


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def load(path, ask: Optional[Ask] = None) -> LoadedModel:
    """Load `path` (or a model named as Ollama names it, from the stores hypura.store searches) as `ask` (Ask.of's
    request; None: Ask.of()) says. Raises ModelFileError (a ValueError) for a missing, non-GGUF, truncated or
    unsupported file before llama.cpp reads it, HypuraError for a placement that cannot be."""
    ask = Ask.of() if ask is None else ask
    path = str(resolve_path(path))
    header = read_header(path, bool(ask.llama["vocab_only"]))  # the vocabulary alone: no weight to place
    lib()  # fail clearly now if the library lacks the hooks
    say = ask.fit.say or (_stderr if ask.llama["verbose"] else None)
    rpc = register_devices(ask.devices, ask.fit.say)  # llama.cpp's device registry: RPC servers probed as added
    decision, found = _decide(path, header, ask, rpc, say)
    runtime = Runtime(header, path, decision)
    if runtime.reads is not None and say is not None:
        say(runtime.reads.line)
    stack = contextlib.ExitStack()  # llama.cpp's model and context
    runtime.own(stack.close)  # first at close: before the layer stream and expert caches
    try:
        with runtime.loading() as hooks:
            loaded = _load(path, header, stack, runtime, decision)
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


def _decide(path: str, header, ask: Ask, rpc: tuple[str, ...], say) -> tuple[Decision, object]:
    """The one decision (hypura.plan.decision) and the draft found for it (None unless one was asked for and
    kept); its line said where verbose."""
    machine = Measured(path, header, rpc, ask.fit, ask.profile, say)
    draft, found_path = ask.draft_beside, None
    if is_auto(draft):  # a draft from the stores, planned beside; kept where the cost model predicts a gain
        decision, found = find_draft(header, ask, machine)
        if found is not None:
            decision, found_path = found.decision, found.path
            if say is not None:
                say(found.line())
    else:  # a draft named, or none
        beside = Beside.of(read_header(draft), ask.n_ubatch) if draft else None
        decision = decide(header, dataclasses.replace(ask, beside=beside), machine.free, machine.profile,
                          machine.routing, devices=machine.devices)
    if decision.line and say is not None:
        say(decision.line)
    return decision, found_path


def _load(path: str, header, stack: contextlib.ExitStack, runtime: Runtime, decision: Decision) -> LoadedModel:
    """llama.cpp's model and context, built as llama_cpp.Llama builds them from the decision's keywords, with
    Hypura's fields set over its params structs (hypura.runtime.params), owned by `stack`."""
    k, fields = dict(decision.keywords, model_path=path), runtime.params.merged()
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
