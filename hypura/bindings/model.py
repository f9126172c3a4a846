"""llama.cpp's model and context, owned as llama-cpp-python's `Llama` owns them: its `_internals.LlamaModel` and
`LlamaContext` entered into the caller's ExitStack, so they close in reverse order (the context before its
model). hypura.loaded.load builds the model Hypura owns on them; the CPU profile's timing decodes on a BareModel
(no placement hooks, no Runtime: the profile is what the decision reads, so it cannot come from a decision)."""

from __future__ import annotations

import contextlib
from typing import Optional

import llama_cpp
import llama_cpp._internals as internals

from hypura.bindings.llama_params import set_fields

_backend_ready = False  # llama_backend_init, once per process


def load_model(stack: contextlib.ExitStack, path: str, params: llama_cpp.llama_model_params,
               verbose: bool = False) -> internals.LlamaModel:
    """The model at `path`, closed by `stack`; raises ValueError as llama-cpp-python does where it fails."""
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True
    return stack.enter_context(contextlib.closing(internals.LlamaModel(path_model=path, params=params,
                                                                       verbose=verbose)))


def new_context(stack: contextlib.ExitStack, model: internals.LlamaModel, params: llama_cpp.llama_context_params,
                verbose: bool = False, cls: type = internals.LlamaContext, **kwargs) -> internals.LlamaContext:
    """A context of `model` (a `cls`, given `kwargs` too), closed by `stack` before the model."""
    return stack.enter_context(contextlib.closing(cls(model=model, params=params, verbose=verbose, **kwargs)))


class BareModel:
    """A model and one context of it, from fields set over llama.cpp's default params, without Hypura's hooks;
    close() frees both."""

    def __init__(self, path: str, model_fields: dict, context_fields: dict, verbose: bool = False):
        self._stack = contextlib.ExitStack()
        try:
            self.model = load_model(self._stack, path, _params(llama_cpp.llama_model_default_params(), model_fields),
                                    verbose)
            self.context = new_context(self._stack, self.model,
                                       _params(llama_cpp.llama_context_default_params(), context_fields), verbose)
        except BaseException:
            self._stack.close()
            raise

    @property
    def ctx(self) -> Optional[llama_cpp.llama_context_p]:
        return self.context.ctx

    def close(self) -> None:
        self._stack.close()


def _params(struct, fields: dict):
    set_fields(struct, fields)
    return struct
