"""`hypura.Llama`: llama-cpp-python's `Llama`, loaded through Hypura's placement hooks.

Same constructor, methods and return shapes as `llama_cpp.Llama` (it is a subclass), so code
written for llama-cpp-python runs unchanged. The model file is checked in Python first, and
every tensor's placement goes through `hypura.runtime.placement.LoaderHooks`.
"""

from __future__ import annotations

import ctypes
from typing import Iterable, Optional, Union

from hypura.bindings.ffi import ffi, lib
from hypura.bindings.library import point_llama_cpp_at_our_library

point_llama_cpp_at_our_library()  # before llama_cpp loads a library of its own

import llama_cpp  # noqa: E402

from hypura.errors import HypuraError  # noqa: E402
from hypura.model_file import read_header  # noqa: E402
from hypura.runtime.overrides import overrides_policy  # noqa: E402
from hypura.runtime.plan_policy import plan_policy, resolve_plan  # noqa: E402
from hypura.runtime.placement import (  # noqa: E402
    FileFiller,
    LoaderHooks,
    Placement,
    PlacementPolicy,
)


def _params_with_overrides(name: str) -> property:
    """A params struct attribute whose fields in `self._param_overrides[name]` are re-applied on
    every read: llama_cpp.Llama.__init__ fills the struct with its own defaults and reads it back
    when it creates the model and the context, so those reads see the overrides."""
    slot = "_" + name

    def get(self):
        params = self.__dict__[slot]
        for key, value in self.__dict__.get("_param_overrides", {}).get(name, {}).items():
            setattr(params, key, value)
        return params

    def set_(self, value):
        self.__dict__[slot] = value

    return property(get, set_)


class Llama(llama_cpp.Llama):
    model_params = _params_with_overrides("model_params")
    context_params = _params_with_overrides("context_params")

    def __init__(
        self,
        model_path: str,
        *args,
        override_tensor: Union[str, Iterable[str], None] = None,
        placement_policy: Optional[PlacementPolicy] = None,
        gpu_mem: Union[int, str, None] = None,
        ram: Union[int, str, None] = None,
        plan=None,
        param_overrides: Optional[dict] = None,
        **kwargs,
    ):
        """Load `model_path` as `llama_cpp.Llama` does, plus Hypura's keyword arguments:

        override_tensor: llama.cpp's `-ot`, "PATTERN=BUFFER_TYPE[,...]" or a list of them.
        placement_policy: a callable TensorInfo -> Placement deciding each tensor's tier
            (default: llama.cpp's own placement, with `override_tensor` applied).
        plan: a hypura.plan.Plan, a plan file (`hypura inspect --json`), or "auto"; with
            gpu_mem/ram budgets ("8GiB") and no plan, one is made now from the cached machine
            profile. Without any of them, tensors go where llama.cpp puts them (n_gpu_layers).
            Plans that stream from disk need the tier runtime and are refused for now.
        param_overrides: {"model_params": {...}, "context_params": {...}}: fields of llama.cpp's
            params structs that llama-cpp-python does not expose (e.g. load_mode,
            flash_attn_type), set over its defaults.

        Raises ModelFileError (a ValueError) for a missing, non-GGUF, truncated or
        unsupported file, before llama.cpp reads it.
        """
        self._param_overrides = param_overrides or {}
        self.header = read_header(model_path)
        lib()  # fail clearly now if the library lacks the hooks
        self.gpu_mem, self.ram = gpu_mem, ram
        self.plan = resolve_plan(plan, self.header, gpu_mem, ram,
                                 n_ctx=kwargs.get("n_ctx", 512), n_ubatch=kwargs.get("n_ubatch", 512))
        if sum(x is not None for x in (self.plan, placement_policy, override_tensor)) > 1:
            raise HypuraError("give one of plan (or gpu_mem/ram budgets), placement_policy and override_tensor")
        if self.plan is not None:
            policy = plan_policy(self.plan)
        else:
            policy = placement_policy or overrides_policy(override_tensor)
        hooks = LoaderHooks(policy, FileFiller([str(model_path)]))
        with hooks:
            try:
                super().__init__(model_path, *args, **kwargs)
            except Exception:
                hooks.raise_pending()
                raise
        self.placement: dict[str, Placement] = {name: p for name, (_, p) in hooks.placed.items()}

    def __del__(self):
        # raising before llama_cpp.Llama.__init__ ran (bad file, bad -ot) leaves nothing to free
        if "_stack" in self.__dict__:
            super().__del__()

    def tensor_buffer(self, name: str) -> Optional[str]:
        """Name of the buffer type holding tensor `name` (e.g. "CPU", "CUDA0"), None if absent."""
        address = ctypes.cast(self.model, ctypes.c_void_p).value
        c_name = lib().hypura_model_tensor_buft(ffi.cast("struct llama_model *", address), name.encode())
        return None if c_name == ffi.NULL else ffi.string(c_name).decode()
