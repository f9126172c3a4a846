"""The runtime of one model: built from the model's header and the one decision (hypura.plan.decision: the plan or
placement policy, llama.cpp's parameters, the expert cache), it applies those parameters over the caller's
(params.py), and makes the placement policy and fill hooks of the load, the per-layer and router hooks of the compute, and owns every lifetime.

Lifetimes (one ExitStack each, closed in reverse order of entry):
  `_users`: what reads or copies into the model's memory (the pager's readers, expert-cache copies,
  the layer streamer's loader thread, the routing recorder's save): closed first.
  `_stack`: then the llama.cpp model and context (`own(close)`), then the layer streamer's
  C stream (the context calls into it until freed), then the expert caches (freed with the model).
Threading: the runtime is built and loaded on one thread; every hook runs on the thread that calls
llama_decode (docs/design.md, "Runtime"); `after_decode` runs there right after each decode.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from typing import Callable, Optional

import llama_cpp

from hypura.bindings.batch import Batch
from hypura.bindings.ffi import ffi, lib
from hypura.errors import HypuraError
from hypura.plan import Plan
from hypura.plan.decision import Decision
from hypura.profile.devices import has_gpu
from hypura.runtime.dense.layer_streamer import LayerStreamer
from hypura.runtime.dense.stream_layout import StreamLayout
from hypura.runtime.mechanism import Mechanism
from hypura.runtime.moe.coactivation import CoactivationPredictor, CoactivationRecorder, model_key
from hypura.runtime.moe.expert_paging import ExpertPager, paged_tensors
from hypura.runtime.moe.expert_streaming import EXPERT_NAMES, ExpertCacheSettings, ExpertStreamer
from hypura.runtime.load_reads import LoadReads, load_reads
from hypura.runtime.mapped_weights import PIN_THREADS, MappedWeights
from hypura.runtime.overrides import overrides_policy
from hypura.runtime.params import LlamaParams
from hypura.runtime.placement import FileFiller, LoaderHooks, Placement, PlacementPolicy, Tier
from hypura.runtime.plan_policy import homes_mapped, plan_layout, plan_policy, ram_experts_evictable
from hypura.plan.pools import GPU_POOL, HOST_POOL
from hypura.runtime.router import Router
from hypura.runtime.stats import RunStats, gpu_free
from hypura.runtime.transfers import Transfers


class Runtime:
    def __init__(self, header, model_path: str, decision: Decision):
        """Applies `decision` (hypura.plan.decision): its plan, or without one its placement policy or -ot rules
        placing every tensor; its llama.cpp parameters (plan/load_params.py) over the caller's fields; its expert
        cache (slots per MoE layer; default: the plan's) and its callback of every MoE layer's chosen experts."""
        plan, load, expert_cache = decision.plan, decision.params, decision.expert_cache
        self.header, self.plan, self.on_route = header, plan, decision.on_route
        self.params = LlamaParams(decision.param_overrides)
        for struct, fields in load.fields().items():
            for key, value in fields.items():
                if key in load.needed:
                    self.params.need(struct, load.needed[key], **{key: value})
                else:
                    self.params.decided(struct, **{key: value})
        # llama.cpp's n_outputs_max where the decision set it (plan/microbatch.py); 0: every token of a batch
        self.outputs_max = int(self.params.merged()["context_params"].get("n_outputs_max") or 0)
        # the caller's: a plan's slots are its default, after the plan's checks
        self.expert_cache = ExpertCacheSettings(slots=expert_cache) if isinstance(expert_cache, int) else expert_cache
        self.mapped: Optional[MappedWeights] = None
        self.layout, self.pager = StreamLayout.empty(), None
        self.streamer: Optional[LayerStreamer] = None
        self.experts: Optional[ExpertStreamer] = None
        self._caches_of = None
        self._users, self._stack = contextlib.ExitStack(), contextlib.ExitStack()
        try:
            self._assemble(model_path, decision.placement_policy or overrides_policy(decision.override_tensor))
        except BaseException:
            self.close()  # what opened before the failure (readers, the mapping, the pager, the loader thread)
            raise

    def _assemble(self, model_path: str, policy: Optional[PlacementPolicy]) -> None:
        """Every part of the runtime, each closed through `_users` or `_stack` as soon as it is made."""
        header, plan, on_route, expert_cache = self.header, self.plan, self.on_route, self.expert_cache
        self._stack.callback(self._free_expert_caches)
        # a plan's load reads through the page cache or around it (load_reads.py); without a plan, llama.cpp's way
        self.reads: Optional[LoadReads] = load_reads([model_path], self.params.given.get("model_params", {}).get(
            "load_mode")) if plan is not None else None
        self.files = FileFiller([str(model_path)], cached=self.reads is not None and self.reads.buffered)
        self._users.callback(self.files.close)  # closed after the load already; here for a failure before it
        self.gpu_free_at_start = gpu_free()  # before anything of this model is on the GPU
        self.policy = self._plan_placement(model_path) if plan is not None else policy
        if expert_cache is None and plan is not None and plan.expert_slots:
            self.expert_cache = expert_cache = ExpertCacheSettings(slots=plan.expert_slots)
        if expert_cache is not None:
            self.policy = self._experts_in_host(self.policy)
        self.router = (Router.of(header, self._route)
                       if on_route is not None or expert_cache or self.pager is not None else None)
        self.recorder = self._routing_recorder()
        self.fill = self._fill_host
        if self.layout.tensors or self.router:
            self._start_streamer()
        self.stats = RunStats(self.mechanisms(), self.streamer, plan, self.gpu_free_at_start)

    # --- before the load ------------------------------------------------------------------------
    def _plan_placement(self, model_path: str) -> PlacementPolicy:
        plan = self.plan
        self.layout = layout = plan_layout(plan)
        paged = paged_tensors(plan)
        if self.expert_cache is not None and plan.streams_stacks:
            raise HypuraError("this plan streams whole expert stacks at large steps, which an expert cache cannot "
                              "share: give no expert cache, or plan again with it")
        if paged and self.expert_cache is not None:
            raise HypuraError("an expert cache loads from every expert in RAM, but this plan keeps experts on "
                              "disk: give more --ram or no expert cache")
        if paged:
            n_used = int(self.header.get("expert_used_count"))
            # the plan's disk staging, less what the host pool's slots take for dense disk layers
            budget = plan.memory["ram"]["staging"] - layout.pool_bytes(HOST_POOL)
            self.pager = ExpertPager(plan, paged, [str(model_path)], n_used, budget, self.files.cached,
                                     evict_ram=ram_experts_evictable(plan))
            self._users.callback(self.pager.close)  # before the model goes: no read may land in freed memory
        # llama.cpp maps nothing (load_reads.py). Mapped by llama.cpp, every page from the first CPU weight to the
        # last stayed in RSS, GPU and streamed tensors' too (H100, the 70B at 8.5 GiB free: RSS peak 70.6 GiB against
        # a 59.9 GiB budget, CPU_Mapped 42 GiB), and a CPU plan's repacked weights were in RSS twice; Hypura's own
        # mapping (mapped_weights.py) touches only the pages of the weights homed there
        self.params.need("model_params", "a plan within a RAM budget", load_mode=self.reads.load_mode)
        if homes_mapped(plan, layout, paged):
            self.mapped = self._mapped_weights(model_path, plan)
        return plan_policy(plan, layout, paged)

    def _mapped_weights(self, model_path: str, plan: Plan) -> MappedWeights:
        """The plan's weights the GPU copies from RAM live in the mapped file, pinned in place (mapped_weights.py):
        a cold file's pages read in on the disk's readers first, a cached one's registered on several threads."""
        cached = self.files.cached
        threads = min(PIN_THREADS, os.cpu_count() or 1) if cached else max(1, plan.rates.disk_readers)
        mapped = MappedWeights([str(model_path)], prefetch=not cached, threads=threads)
        self._stack.callback(mapped.close)  # after the model and its contexts, which compute from the mapping
        return mapped

    def _experts_in_host(self, policy: PlacementPolicy) -> PlacementPolicy:
        """The stacked experts go to plain host memory (pinned with a GPU), the loads' source (without a GPU in
        plain CPU buffers: the decision turned the repacking ones off, plan/load_params.py)."""
        tier = Tier.PINNED if has_gpu() else Tier.HOST
        return lambda info: Placement(tier=tier) if info.name.endswith(EXPERT_NAMES) else policy(info)

    def _routing_recorder(self) -> Optional[CoactivationRecorder]:
        """Where a router hook runs, its choices are counted and persist for the next run's plan and
        prefetch (moe/coactivation.py), from the counts of earlier runs."""
        router = self.router
        if router is None or len(router.layers) < 2:
            return None
        key = model_key(self.header)
        predictor = CoactivationPredictor.load(key, len(router.layers), router.n_expert)
        recorder = CoactivationRecorder(predictor, router.layers)
        # saved at close, or at exit for a runtime never closed (before modules are torn down: saving needs imports)
        self._users.callback(weakref.finalize(self, _save_routing, recorder, key))
        return recorder

    def _start_streamer(self) -> None:
        plan = self.plan
        self.streamer = streamer = LayerStreamer(self.layout, self.files, plan.prefetch_depth if plan else 0,
                                                 self.router, plan.rates.disk_readers if plan else 1,
                                                 plan.streamed_at if plan is not None and plan.step_paths else None,
                                                 self.mapped)
        self._stack.callback(streamer.close)  # after the context: it calls into the stream until freed
        fn, user_data = streamer.eval_callback()
        self.params.need("context_params", "the compute hooks", cb_eval=llama_cpp.ggml_backend_sched_eval_callback(fn),
                         cb_eval_user_data=user_data)
        layout, pager = self.layout, self.pager

        def fill(info, t):
            if info.name in layout.tensors:
                return streamer.fill(info, t)
            return (pager.fill if pager is not None and info.name in pager.tensors else self._fill_host)(info, t)

        self.fill = fill

    def _fill_host(self, info, tensor) -> None:
        """A deferred host tensor outside the stream and the pager: a CPU weight the GPU copies, at home in the
        mapped file (pinned after the load)."""
        if self.mapped is None:
            return self.files(info, tensor)
        self.mapped.rehome(tensor, info)

    # --- the load -------------------------------------------------------------------------------
    def own(self, close: Callable[[], None]) -> None:
        """close() frees the llama.cpp model and context, first of all at close (before the stream and caches)."""
        self._stack.callback(close)

    @contextlib.contextmanager
    def loading(self):
        """llama.cpp's load runs in the body, under the loader hooks (yielded: their `placed`); on failure
        everything is closed and the error raised."""
        hooks = LoaderHooks(self.policy, self.fill)
        copies_to_gpu = has_gpu() and (bool(self.layout.layers(GPU_POOL)) or self.expert_cache is not None)
        try:
            with hooks:
                # weight copies queue on the host->GPU copy engine: a pinned activation copy would wait behind them
                lib().hypura_cpu_compute_pageable(copies_to_gpu)
                try:
                    yield hooks
                    if self.mapped is not None:
                        self.mapped.pin()  # before anything computes: the GPU copies from these pages
                except Exception:
                    hooks.raise_pending()
                    raise
                finally:
                    self.files.close()
                    if self.reads is not None:
                        self.reads.settle()
                    lib().hypura_cpu_compute_pageable(False)
        except BaseException:
            self.close()
            raise

    def attach(self, c_model) -> None:
        """After the load: start the expert caches on the model (struct llama_model *)."""
        if self.expert_cache is not None:
            gpu = has_gpu()
            copies = Transfers([], {}, False, copy_stream=True) if gpu else None
            if copies is not None:
                self._users.callback(copies.close)
            self._caches_of = c_model
            self.experts = ExpertStreamer(c_model, self.router.layers, self.router.n_used, self.expert_cache,
                                          Tier.GPU if gpu else Tier.HOST, copies, self.recorder)
            if self.on_route is None:  # hits need no Python; an on_route callback must see every batch
                self.experts.attach(self.streamer.c_stream)
        if self.streamer is not None:
            self._users.callback(self.streamer.transfers.close)  # loads in flight finish before the pool is freed
        self.stats.mechanisms = self.mechanisms()

    # --- compute time ---------------------------------------------------------------------------
    def mechanisms(self) -> list[Mechanism]:
        """The decode-time mechanisms, in the order their after_decode runs."""
        # the expert cache drains before the recorder flushes what it observed
        return [m for m in (self.streamer, self.experts, self.pager, self.recorder) if m is not None]

    def _route(self, layer: int, ids) -> None:
        """The router fan-out, on the compute thread inside the router hook."""
        if self.pager is not None:  # first: the experts must be in RAM before anything computes from them
            self.pager.page_in(layer, ids)
        if self.experts is not None:
            self.experts.serve(layer, ids)  # records the routing too
        elif self.recorder is not None:
            self.recorder.observe(layer, ids.tolist())
        if self.on_route is not None:
            self.on_route(layer, ids)

    def decode(self, ctx, batch: Batch, decode: Optional[bool] = None) -> int:
        """llama_decode `batch` on `ctx` (llama-cpp-python's llama_context_p) and synchronize, timed for the
        stats as decode or prefill (RunStats.timed); then each mechanism's after_decode: a streaming failure
        raises (the decode's results are void), what C answered alone is replayed. Returns llama_decode's
        status (0 ok, 1 no KV slot for the batch, < 0 error)."""
        if self.outputs_max and batch.n_tokens > self.outputs_max and batch.outputs() > self.outputs_max:
            # llama.cpp aborts the process on such a batch (llama-context.cpp output_reserve)
            raise HypuraError(f"a batch asks {batch.outputs()} outputs, more than this context's n_outputs_max "
                              f"({self.outputs_max}): give n_outputs_max (0: every token) in the context params")
        if self.streamer is not None:
            self.streamer.set_step(batch.n_tokens)  # this step's path for RAM weights (per-step paths)
        if self.mapped is not None:
            self.mapped.check()  # a file cut since the last decode would fault (SIGBUS) in the mapping
        with self.stats.timed(batch.n_tokens, decode):
            rc = llama_cpp.llama_decode(ctx, batch.c)
            llama_cpp.llama_synchronize(ctx)
        if self.mapped is not None:
            self.mapped.check()
        for m in self.mechanisms():
            m.after_decode()
        return rc

    def summary(self, reset: bool = False) -> dict:
        out = self.stats.summary()
        for m in self.mechanisms():
            if m.name and (s := m.summary()) is not None:
                out[m.name] = s
        if reset:
            self.stats.reset()
            for m in self.mechanisms():
                m.reset_stats()
        return out

    def probe_disk(self, seconds: float) -> Optional[dict]:
        return self.pager.probe(seconds) if self.pager is not None else None

    def raise_stream_error(self) -> None:
        if self.streamer is not None:
            self.streamer.raise_pending()

    def close(self) -> None:
        """Safe to call twice; the users of the model's memory first, then the model, then the rest."""
        try:
            self._users.close()
        finally:
            self.experts = None
            self._stack.close()

    def _free_expert_caches(self) -> None:
        model, self._caches_of = self._caches_of, None
        if model is not None:
            lib().hypura_expert_caches_free(model)  # after the context computing from them, with the model


def _save_routing(recorder: CoactivationRecorder, key: str) -> None:
    if recorder.recorded:
        try:
            recorder.predictor.save(key)
        except OSError as e:  # a cache that cannot be written costs the next plan its statistics, not this run
            warnings.warn(f"hypura: recorded routing not saved ({e}); the next run plans without it", stacklevel=2)


def as_model_pointer(ctypes_model) -> object:
    """llama-cpp-python's model (a ctypes pointer) as our cffi `struct llama_model *`."""
    import ctypes

    return ffi.cast("struct llama_model *", ctypes.cast(ctypes_model, ctypes.c_void_p).value)
