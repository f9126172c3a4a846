"""llama-cpp-python's `Llama` keywords as llama.cpp's `llama_model_params` and `llama_context_params`, field by
field as its constructor sets them: hypura.Llama takes the same keywords, with the same defaults and meaning,
and builds its model and context from these structs after Hypura's own fields (hypura.runtime.params) are set
over them once."""

from __future__ import annotations

import ctypes
import inspect
import multiprocessing
from dataclasses import dataclass
from typing import Optional

import llama_cpp

_SIGNATURE = inspect.signature(llama_cpp.Llama.__init__)
_KV_STR_BYTES = 128  # llama_model_kv_override's val_str
LLAMA_SPLIT_MODE_LAYER = llama_cpp.LLAMA_SPLIT_MODE_LAYER


def llama_keywords(model_path: str, given: dict) -> dict:
    """Every keyword of llama_cpp.Llama: the value given, else its default. Unknown ones land in "kwargs",
    which llama-cpp-python ignores (and so does hypura.Llama)."""
    bound = _SIGNATURE.bind(None, model_path, **given)  # raises TypeError as llama_cpp.Llama would
    bound.apply_defaults()
    out = dict(bound.arguments)
    del out["self"]
    return out


@dataclass
class ModelParams:
    """llama_model_params and the C arrays it points into (kept alive as long as it)."""

    params: llama_cpp.llama_model_params
    tensor_split: Optional[ctypes.Array] = None
    kv_overrides: Optional[ctypes.Array] = None


def model_params(k: dict) -> ModelParams:
    """llama_model_params from llama_cpp.Llama's keywords `k` (llama_keywords)."""
    p = llama_cpp.llama_model_default_params()
    p.n_gpu_layers = 0x7FFFFFFF if k["n_gpu_layers"] == -1 else k["n_gpu_layers"]  # INT32_MAX: every layer
    p.split_mode, p.main_gpu, p.vocab_only = k["split_mode"], k["main_gpu"], k["vocab_only"]
    out = ModelParams(p)
    if k["tensor_split"] is not None:
        if len(k["tensor_split"]) > llama_cpp.LLAMA_MAX_DEVICES:
            raise ValueError(f"Attempt to split tensors that exceed maximum supported devices. Current "
                             f"LLAMA_MAX_DEVICES={llama_cpp.LLAMA_MAX_DEVICES}")
        out.tensor_split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*k["tensor_split"])
        p.tensor_split = out.tensor_split
    mmap, mlock = k["use_mmap"] and k["lora_path"] is None, k["use_mlock"]
    p.load_mode = (llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK if mmap and mlock else llama_cpp.LLAMA_LOAD_MODE_MLOCK
                   if mlock else llama_cpp.LLAMA_LOAD_MODE_MMAP if mmap else llama_cpp.LLAMA_LOAD_MODE_NONE)
    if k["kv_overrides"] is not None:
        out.kv_overrides = p.kv_overrides = _kv_overrides(k["kv_overrides"])
    return out


def _kv_overrides(overrides: dict) -> ctypes.Array:
    """The metadata overrides as llama_model_kv_override structs, closed by an empty key."""
    array = (llama_cpp.llama_model_kv_override * (len(overrides) + 1))()
    for item, (key, v) in zip(array, overrides.items()):
        item.key = key.encode("utf-8")
        if isinstance(v, bool):  # before int: a bool is an int
            item.tag, item.value.val_bool = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_BOOL, v
        elif isinstance(v, int):
            item.tag, item.value.val_i64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, v
        elif isinstance(v, float):
            item.tag, item.value.val_f64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_FLOAT, v
        elif isinstance(v, str):
            data = v.encode("utf-8")
            if len(data) > _KV_STR_BYTES:
                raise ValueError(f"Value for {key} is too long: {v}")
            item.tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR
            offset = llama_cpp.llama_model_kv_override_value.val_str.offset
            ctypes.memmove(ctypes.addressof(item.value) + offset, data.ljust(_KV_STR_BYTES, b"\0"), _KV_STR_BYTES)
        else:
            raise ValueError(f"Unknown value type for {key}: {v}")
    array[-1].key = b"\0"
    return array


def threads(k: dict) -> tuple[int, int]:
    """llama-cpp-python's thread counts: unset, half the logical CPUs, and all of them for batches."""
    cpus = multiprocessing.cpu_count()
    return k["n_threads"] or max(cpus // 2, 1), k["n_threads_batch"] or cpus


def context_params(k: dict, n_ctx_train: int) -> llama_cpp.llama_context_params:
    """llama_context_params from llama_cpp.Llama's keywords `k`; n_ctx 0 is the model's training context."""
    p = llama_cpp.llama_context_default_params()
    p.n_ctx = k["n_ctx"] or n_ctx_train
    p.n_batch = min(p.n_ctx, k["n_batch"])
    p.n_ubatch = min(p.n_batch, k["n_ubatch"])
    p.n_threads, p.n_threads_batch = threads(k)
    p.rope_scaling_type = (k["rope_scaling_type"] if k["rope_scaling_type"] is not None
                           else llama_cpp.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED)
    p.pooling_type, p.attention_type = k["pooling_type"], k["attention_type"]
    for field in ("rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast",
                  "yarn_beta_slow", "yarn_orig_ctx"):
        setattr(p, field, k[field])
    p.embeddings, p.offload_kqv, p.no_perf = k["embedding"], k["offload_kqv"], k["no_perf"]
    p.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if k["flash_attn"]
                         else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    for field in ("op_offload", "swa_full", "type_k", "type_v"):  # unset: llama.cpp's default
        if k[field] is not None:
            setattr(p, field, k[field])
    if k["embedding"]:  # one sequence per input of a batch
        p.n_seq_max = min(p.n_batch, llama_cpp.llama_max_parallel_sequences())
        p.kv_unified = True
    return p


def set_fields(struct, fields: dict) -> None:
    """Set `fields` over a params struct (Hypura's, in hypura.runtime.params' precedence)."""
    for key, value in fields.items():
        setattr(struct, key, value)
