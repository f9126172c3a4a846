"""A model Hypura loaded (hypura.loaded.load): llama.cpp's model, its one context (KV cache methods), the
vocabulary, the Runtime that placed and streams it, and the decision it was loaded by; closed in one place.
The engine, hypura-cli, speculation and bench take it; hypura.Llama fills llama-cpp-python's state from it."""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Optional

import llama_cpp
import llama_cpp._internals as internals

from hypura.bindings.batch import Batch
from hypura.bindings.ffi import ffi, lib
from hypura.bindings.llama_params import ModelParams
from hypura.bindings.vocab import Vocab
from hypura.loaded.context import Context
from hypura.runtime.runtime import Runtime, as_model_pointer


class LoadedModel:
    _closed = True  # until __init__ ends: a failed load's runtime is closed by load() itself

    def __init__(self, path: str, header, keywords: dict, runtime: Runtime, stack: contextlib.ExitStack,
                 model: internals.LlamaModel, context: Context, model_params: ModelParams, keep_alive: tuple,
                 context_params: llama_cpp.llama_context_params, decision):
        self.path, self.header = path, header
        self.keywords = keywords  # llama_cpp.Llama's keywords as loaded (n_ctx, n_batch, threads: as decided)
        self.runtime = runtime
        self._stack = stack  # the model, the context and what front ends own() on them; closed by the runtime
        self.model = model  # llama-cpp-python's model owner (.model: llama_model *)
        self.context = context
        self.vocab = Vocab(model.model)
        self._model_params, self._keep_alive = model_params, keep_alive  # structs and arrays llama.cpp points into
        self.model_params = model_params.params
        self.context_params = context_params
        self.decision = decision  # hypura.plan.decision.Decision: the plan, the devices, the split
        self.draft_found = None  # the draft the decision kept beside (a Path), asked for as "auto"
        self.placement: dict = {}  # tensor name -> Placement, as the hooks placed it
        self.lora_adapter = None
        self._closed = False

    # --- what the decision chose ------------------------------------------------------------------
    @property
    def plan(self):
        return self.decision.plan

    @property
    def fit_decision(self):
        """The decision where the default path or the budgets chose (it has a line), else None."""
        return self.decision if self.decision.line and self.decision.shares is None else None

    @property
    def n_threads(self) -> int:
        return self.context_params.n_threads

    @property
    def n_threads_batch(self) -> int:
        return self.context_params.n_threads_batch

    @property
    def n_batch(self) -> int:
        return self.context_params.n_batch

    def n_ctx(self) -> int:
        return self.context.n_ctx()

    def n_vocab(self) -> int:
        return self.vocab.n_tokens

    @property
    def ctx(self):
        """llama.cpp's context (a llama_context *), for llama.cpp's samplers and perf counters."""
        return self.context.ctx

    @functools.cached_property
    def metadata(self) -> dict:
        return self.model.metadata()

    # --- decoding and stats ---------------------------------------------------------------------
    def decode_tokens(self, tokens: list[int], decode: Optional[bool] = None) -> bool:
        """llama_decode `tokens` after those in the KV cache, then synchronize, as llama-bench and the C tools do;
        timed for stats() as decode or prefill (`decode`; unset: one token is decode). False when llama_decode
        fails; raises when weights could not be streamed."""
        return self.context.decode_tokens(tokens, decode)

    def decode_batch(self, batch: Batch, decode: bool = False) -> int:
        """llama_decode a prepared batch (tokens of any sequences), timed as decode when `decode` (one new token
        per sequence) else as prefill. llama_decode's status (0 ok, 1 no KV slot, < 0 error)."""
        return self.context.decode(batch, decode)

    def stats(self, reset: bool = False) -> dict:
        """Since load (or the last reset): prefill and decode tok/s, streamed bytes per token from each tier,
        stall ms per token, GB/s per link, the plan's prediction, and memory beside the plan's budgets."""
        return self.runtime.summary(reset)

    def probe_disk(self, seconds: float = 1.0) -> Optional[dict]:
        """GB/s that the disk gives this plan's expert reads now; None when no expert lives on disk."""
        return self.runtime.probe_disk(seconds)

    def raise_stream_error(self) -> None:
        """Raise if weights could not be streamed during the last decode (its results are void)."""
        self.runtime.raise_stream_error()

    def tensor_buffer(self, name: str) -> Optional[str]:
        """Name of the buffer type holding tensor `name` (e.g. "CPU", "CUDA0"), None if absent."""
        c_name = lib().hypura_model_tensor_buft(as_model_pointer(self.model.model), name.encode())
        return None if c_name == ffi.NULL else ffi.string(c_name).decode()

    # --- lifetime -------------------------------------------------------------------------------
    def own(self, close: Callable[[], None]) -> None:
        """Close `close` with the model, before its context (what points into the context or the model)."""
        self._stack.callback(close)

    def close(self) -> None:
        """Hypura's threads and reads stop, then what front ends own, the context and the model go, then the
        pools; twice is safe."""
        if not self._closed:
            self._closed = True
            self.runtime.close()  # the stack (model, context, owned) closes inside, in its place

    def __enter__(self) -> "LoadedModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()
