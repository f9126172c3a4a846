"""common/common.cpp for `hypura-cli`: the model and context from the flags (common_init_from_params), as
llama-completion makes them (the vocabulary is hypura.bindings.vocab's).

The model and context come from `hypura.loaded.load`, so Hypura's placement hooks are in charge of every
tensor; generation then calls llama.cpp's C API directly (decode, sampler chain), as the C tool does.
"""

from __future__ import annotations

import os
import sys

from hypura.cli.completion.common_params import KV_CACHE_TYPES, Settings
from hypura.loaded import Ask, LoadedModel, load
from hypura.plan.auto import Fit

import llama_cpp  # after hypura: it must load our library

_LOAD_MODES = {
    "auto": llama_cpp.LLAMA_LOAD_MODE_AUTO, "none": llama_cpp.LLAMA_LOAD_MODE_NONE,
    "mmap": llama_cpp.LLAMA_LOAD_MODE_MMAP, "mlock": llama_cpp.LLAMA_LOAD_MODE_MLOCK,
    "mmap+mlock": llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK, "dio": llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO,
}
_ROPE_SCALING = {None: llama_cpp.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED, "none": llama_cpp.LLAMA_ROPE_SCALING_TYPE_NONE,
                 "linear": llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR, "yarn": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN}
_NUMA = {None: False, "distribute": llama_cpp.GGML_NUMA_STRATEGY_DISTRIBUTE,
         "isolate": llama_cpp.GGML_NUMA_STRATEGY_ISOLATE, "numactl": llama_cpp.GGML_NUMA_STRATEGY_NUMACTL}
_FLASH_ATTN = {None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO, True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


def load_model(s: Settings, model_path: str, say=None) -> LoadedModel:
    """say: where the default path's one line goes (the console: Python's stderr is quiet while loading)."""
    n_threads = s.n_threads if s.n_threads > 0 else None  # Llama's default: physical cores (fewer if paging)
    n_threads_batch = s.n_threads_batch if s.n_threads_batch > 0 else n_threads
    model_overrides = {"n_gpu_layers": s.n_gpu_layers, "load_mode": _LOAD_MODES[s.load_mode],
                       "use_extra_bufts": s.repack, "no_host": s.no_host, "check_tensors": s.check_tensors}
    context_overrides = {
        "n_ctx": s.n_ctx, "n_batch": s.n_batch, "n_ubatch": s.n_ubatch, "n_seq_max": 1,
        "flash_attn_type": _FLASH_ATTN[s.flash_attn],
        "type_k": KV_CACHE_TYPES[s.cache_type_k], "type_v": KV_CACHE_TYPES[s.cache_type_v],
        "rope_scaling_type": _ROPE_SCALING[s.rope_scaling],
        "rope_freq_base": s.rope_freq_base, "rope_freq_scale": s.rope_freq_scale,
        "yarn_ext_factor": s.yarn_ext_factor, "yarn_attn_factor": s.yarn_attn_factor,
        "yarn_beta_fast": s.yarn_beta_fast, "yarn_beta_slow": s.yarn_beta_slow, "yarn_orig_ctx": s.yarn_orig_ctx,
        "offload_kqv": s.kv_offload, "op_offload": s.op_offload, "no_perf": not s.perf,
        "swa_full": s.swa_full, "kv_unified": False, "embeddings": False,
    }
    if s.speculative is not None and s.speculative.tree:  # a draft tree's branches are sequences of one KV cache
        from hypura.speculative.tree import context_params

        context_overrides.update(context_params(s.speculative.tree))
    if s.speculative is not None:  # a verification pass reads a row for each token it carries
        context_overrides["n_outputs_max"] = max(s.speculative.pass_rows, context_overrides["n_seq_max"])
    fit, devices = _fit(s, say), _device_kwargs(s)
    with _quiet_python_stderr():  # llama-cpp-python's own prints stay quiet; llama.cpp logs still flow
        return load(model_path, Ask.of(
            param_overrides={"model_params": model_overrides, "context_params": context_overrides},
            n_ctx=s.n_ctx, n_batch=s.n_batch, n_ubatch=s.n_ubatch, n_threads=n_threads,
            n_threads_batch=n_threads_batch, seed=s.sampling.seed,
            override_tensor=list(s.override_tensor) or None,
            kv_overrides=dict(s.kv_overrides) or None, numa=_NUMA[s.numa],
            gpu_mem=s.gpu_mem, ram=s.ram, plan=str(s.plan) if s.plan else None,
            expert_cache=s.expert_slots, verbose=True, fit=fit,
            draft_beside=s.speculative.beside if s.speculative is not None else None,
            parallel=max(1, s.speculative.tree) if s.speculative is not None and s.speculative.tree else 1,
            **devices,
        ))


def _device_kwargs(s: Settings) -> dict:
    """--rpc, -dev, -sm, -ts, -mg, --rpc-mem, --split as hypura.loaded.Ask.of keywords; none given: none passed (the one-GPU
    path, unchanged)."""
    d = s.devices
    out = {"rpc_servers": d.rpc, "devices": d.devices, "rpc_mem": d.rpc_mem, "split": d.split or None,
           "split_mode": d.split_mode, "main_gpu": d.main_gpu,
           "tensor_split": list(d.tensor_split) if d.tensor_split is not None else None}
    defaults = {"split_mode": llama_cpp.LLAMA_SPLIT_MODE_LAYER, "main_gpu": 0}
    return {k: v for k, v in out.items() if v is not None and defaults.get(k, object()) != v}


def _fit(s: Settings, say) -> Fit:
    """llama.cpp's --fit rules: any placement flag the user set turns it off."""
    return Fit(enabled=s.fit and not s.placement_set, gpu_margin=s.fit_target_mib << 20, min_ctx=s.fit_ctx, say=say)


class _quiet_python_stderr:
    def __enter__(self):
        self.saved, self.null = sys.stderr, open(os.devnull, "w")
        sys.stderr = self.null

    def __exit__(self, *exc):
        sys.stderr = self.saved
        self.null.close()  # the file this opened: sys.stderr may have been swapped meanwhile (pytest's capture)
