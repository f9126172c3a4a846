"""`hypura.Llama`: llama-cpp-python's `Llama`, loaded through Hypura's placement hooks.

Same constructor, methods and return shapes as `llama_cpp.Llama` (it is a subclass), so code
written for llama-cpp-python runs unchanged. The model file is checked in Python first, and
every tensor's placement goes through `hypura.runtime.placement.LoaderHooks`.
"""

from __future__ import annotations

import ctypes
import warnings
import weakref
from typing import Callable, Iterable, Optional, Union

from hypura.bindings.ffi import ffi, lib
from hypura.bindings.library import point_llama_cpp_at_our_library

point_llama_cpp_at_our_library()  # before llama_cpp loads a library of its own

import llama_cpp  # noqa: E402

from hypura.bindings.llama_log import LogCapture  # noqa: E402
from hypura.errors import HypuraError  # noqa: E402
from hypura.model_file import read_header  # noqa: E402
from hypura.runtime.coactivation import CoactivationPredictor, CoactivationRecorder, model_key  # noqa: E402
from hypura.runtime.expert_paging import (  # noqa: E402
    ExpertPager, disk_prefetch, llama_threads, paged_tensors, recorded_guess)
from hypura.runtime.expert_streaming import EXPERT_NAMES, ExpertCacheSettings, ExpertStreamer  # noqa: E402
from hypura.runtime.overrides import overrides_policy  # noqa: E402
from hypura.runtime.plan_policy import plan_layout, plan_policy, resolve_plan  # noqa: E402
from hypura.runtime.placement import (  # noqa: E402
    FileFiller,
    LoaderHooks,
    Placement,
    PlacementPolicy,
    Tier,
)
from hypura.profile.devices import has_gpu  # noqa: E402
from hypura.runtime.transfers import Transfers  # noqa: E402
from hypura.runtime.stats import RunStats, gpu_free  # noqa: E402
from hypura.runtime.stream_layout import GPU_POOL, HOST_POOL, StreamLayout  # noqa: E402
from hypura.runtime.router_lookahead import RouterLookahead  # noqa: E402
from hypura.runtime.streaming import LayerStreamer, Router  # noqa: E402


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
        on_route: Optional[Callable[[int, "np.ndarray"], None]] = None,
        expert_cache: Union[ExpertCacheSettings, int, None] = None,
        **kwargs,
    ):
        """Load `model_path` as `llama_cpp.Llama` does, plus Hypura's keyword arguments:

        override_tensor: llama.cpp's `-ot`, "PATTERN=BUFFER_TYPE[,...]" or a list of them.
        placement_policy: a callable TensorInfo -> Placement deciding each tensor's tier
            (default: llama.cpp's own placement, with `override_tensor` applied).
        plan: a hypura.plan.Plan, a plan file (`hypura inspect --json`), or "auto"; with
            gpu_mem/ram budgets ("8GiB") and no plan, one is made now from the cached machine
            profile. Without any of them, tensors go where llama.cpp puts them (n_gpu_layers).
            A plan sets n_gpu_layers and offload_kqv itself, and streams the layers it does not
            keep resident through pool slots (hypura.runtime.streaming).
        param_overrides: {"model_params": {...}, "context_params": {...}}: fields of llama.cpp's
            params structs that llama-cpp-python does not expose (e.g. load_mode,
            flash_attn_type), set over its defaults.
        on_route: MoE models: called as on_route(layer, ids) with each layer's chosen experts
            ([n_tokens, n_expert_used] int32) once per layer and batch, before the expert matmuls.
        n_threads: unset, llama.cpp's default (physical cores; llama-cpp-python guesses half the logical
            CPUs), less a quarter when the plan pages experts from disk (their reads need cores).
        n_threads_batch: unset, as n_threads where Hypura chose that or experts page; else llama-cpp-python's
            default (all logical CPUs).
        expert_cache: MoE models: slots per layer (or ExpertCacheSettings) of an expert cache in GPU
            memory (host memory without a GPU) that decode computes from; the stacked experts stay
            in host memory and load into slots on demand or ahead (hypura.runtime.expert_streaming).

        Raises ModelFileError (a ValueError) for a missing, non-GGUF, truncated or
        unsupported file, before llama.cpp reads it.
        """
        # our own copy: the plan's params are added to it, and must not leak into the caller's dict
        self._param_overrides = {name: dict(fields) for name, fields in (param_overrides or {}).items()}
        self.header = read_header(model_path)
        lib()  # fail clearly now if the library lacks the hooks
        self.gpu_mem, self.ram = gpu_mem, ram
        self.plan = resolve_plan(plan, self.header, gpu_mem, ram,
                                 n_ctx=kwargs.get("n_ctx", 512), n_ubatch=kwargs.get("n_ubatch", 512))
        if sum(x is not None for x in (self.plan, placement_policy, override_tensor)) > 1:
            raise HypuraError("give one of plan (or gpu_mem/ram budgets), placement_policy and override_tensor")
        files = FileFiller([str(model_path)])
        gpu_free_at_start = gpu_free()  # before anything of this model is on the GPU
        self._streamer: Optional[LayerStreamer] = None
        fill = files
        layout = StreamLayout.empty()
        self._pager: Optional[ExpertPager] = None
        if self.plan is not None:
            layout = plan_layout(self.plan)
            paged = paged_tensors(self.plan)
            if paged and expert_cache is not None:
                raise HypuraError("an expert cache loads from every expert in RAM, but this plan keeps experts on "
                                  "disk: give more --ram or no expert cache")
            if paged:
                n_used = int(self.header.get("expert_used_count"))
                # the plan's disk staging, less what the host pool's slots take for dense disk layers
                budget = self.plan.memory["ram"]["staging"] - layout.pool_bytes(HOST_POOL)
                self._pager = ExpertPager(self.plan, paged, [str(model_path)], n_used, budget)
                # slices are written in ggml's plain layout: no repacking CPU buffer types; and no pinned host
                # buffers, which are resident whole (an H200 run kept all 6.4 GiB of disk experts in RSS)
                self._param_overrides.setdefault("model_params", {}).update(use_extra_bufts=False, no_host=True)
            policy = plan_policy(self.plan, layout, paged)
            self._apply_plan_params(layout, bool(paged))
        else:
            policy = placement_policy or overrides_policy(override_tensor)
        chosen = not kwargs.get("n_threads")
        if chosen:
            kwargs["n_threads"] = llama_threads(paged=self._pager is not None)
        if not kwargs.get("n_threads_batch") and (chosen or self._pager is not None):
            kwargs["n_threads_batch"] = kwargs["n_threads"]
        self._experts: Optional[ExpertStreamer] = None
        self._expert_copies: Optional[Transfers] = None
        self._on_route = on_route
        if isinstance(expert_cache, int):
            expert_cache = ExpertCacheSettings(slots=expert_cache)
        if expert_cache is None and self.plan is not None and self.plan.expert_slots:
            expert_cache = ExpertCacheSettings(slots=self.plan.expert_slots)
        if expert_cache is not None:
            policy = self._experts_in_host(policy)
        router = (Router.of(self.header, self._route)
                  if on_route is not None or expert_cache or self._pager is not None else None)
        self._recorder = self._routing_recorder(router)
        # reading disk experts ahead is opt-in ($HYPURA_DISK_PREFETCH): from recorded routing it guessed too little
        # to gain on synthetic routing, and decode ran slower (H200, bench/RESULTS.md)
        prefetch = disk_prefetch() if self._pager is not None else None
        if prefetch == "recorded" and self._recorder is not None:
            self._pager.likely_next = recorded_guess(self._recorder)
        if layout.tensors or router:
            self._streamer = streamer = LayerStreamer(layout, files, self.plan.prefetch_depth if self.plan else 0,
                                                      router)
            if self._pager is not None:
                self._pager.tally = streamer.stats
            fn, user_data = streamer.eval_callback()
            self._param_overrides.setdefault("context_params", {}).update(
                cb_eval=llama_cpp.ggml_backend_sched_eval_callback(fn), cb_eval_user_data=user_data)
            pager = self._pager

            def fill(info, t):
                if info.name in layout.tensors:
                    return streamer.fill(info, t)
                return (pager.fill if pager is not None and info.name in pager.tensors else files)(info, t)
        hooks = LoaderHooks(policy, fill)
        copies_to_gpu = has_gpu() and (bool(layout.layers(GPU_POOL)) or expert_cache is not None)
        with hooks:
            # weight copies queue on the host->GPU copy engine: a pinned activation copy would wait behind them
            lib().hypura_cpu_compute_pageable(copies_to_gpu)
            log = LogCapture()  # llama.cpp says why a load failed only in its log
            try:
                with log:
                    super().__init__(model_path, *args, **kwargs)
                log.replay()
            except Exception as e:
                hooks.raise_pending()
                self._close_streamer()
                clearer = log.failure(e, model_path)
                if clearer is not None:
                    raise clearer from None
                raise
            finally:
                files.close()
                lib().hypura_cpu_compute_pageable(False)
        self.placement: dict[str, Placement] = {name: p for name, (_, p) in hooks.placed.items()}
        if expert_cache is not None:
            self._start_experts(expert_cache, router)
        if prefetch == "router":
            self._start_lookahead(router)
        self._stats = RunStats(self._streamer, self.plan, gpu_free_at_start)
        self._wrap_decode()

    # --- expert caches ---------------------------------------------------------------------------
    def _experts_in_host(self, policy: PlacementPolicy) -> PlacementPolicy:
        """The stacked experts go to plain host memory (pinned with a GPU), the loads' source; without a
        GPU, no repacked CPU buffers (their layout is not ggml's, so slices could not be copied)."""
        gpu = has_gpu()
        model = self._param_overrides.setdefault("model_params", {})
        if gpu:  # read, not mapped: with mmap, llama.cpp maps what would be pinned (copies 6x slower)
            model.setdefault("n_gpu_layers", -1)
            model.setdefault("load_mode", llama_cpp.LLAMA_LOAD_MODE_NONE)
        else:
            model["use_extra_bufts"] = False
        tier = Tier.PINNED if gpu else Tier.HOST
        return lambda info: Placement(tier=tier) if info.name.endswith(EXPERT_NAMES) else policy(info)

    def _routing_recorder(self, router: Optional[Router]) -> Optional[CoactivationRecorder]:
        """Where a router hook runs, its choices are counted and persist for the next run's plan and
        prefetch (coactivation.py), from the counts of earlier runs."""
        if router is None or len(router.layers) < 2:
            return None
        key = model_key(self.header)
        predictor = CoactivationPredictor.load(key, len(router.layers), router.n_expert)
        recorder = CoactivationRecorder(predictor, router.layers)
        # saved by close(), or at exit for a Llama never closed (before modules are torn down: saving needs imports)
        self._save_routing = weakref.finalize(self, _save_routing, recorder, key)
        return recorder

    def _start_experts(self, settings: ExpertCacheSettings, router: Router) -> None:
        gpu = has_gpu()
        model = self._c_model()
        self._expert_copies = Transfers([], {}, False, copy_stream=True) if gpu else None
        self._caches_of = model
        self._experts = ExpertStreamer(model, router.layers, router.n_used, settings,
                                       Tier.GPU if gpu else Tier.HOST, self._expert_copies, self._recorder)
        if self._on_route is None:  # hits need no Python; an on_route callback must see every batch
            self._experts.attach(self._streamer.c_stream)

    def _start_lookahead(self, router: Router) -> None:
        """The pager reads ahead what the next layer's router makes of this layer's router input."""
        model = self._c_model()
        self._lookahead = RouterLookahead(model, router.layers, int(self.header.get("embedding_length")),
                                          router.n_used)
        self._streamer.on_selected = self._lookahead.seen
        self._pager.likely_next = self._lookahead.likely_next

    def _route(self, layer: int, ids) -> None:
        if self._pager is not None:  # first: the experts must be in RAM before anything computes from them
            self._pager.page_in(layer, ids)
        if self._experts is not None:
            self._experts.serve(layer, ids)  # records the routing too
        elif self._recorder is not None:
            self._recorder.observe(layer, ids.tolist())
        if self._on_route is not None:
            self._on_route(layer, ids)

    def _apply_plan_params(self, layout: StreamLayout, paged: bool) -> None:
        """A plan decides what -ngl and --no-kv-offload would: every layer's work on the GPU when it
        uses one (the hook keeps CPU-computed weights in host memory), the KV cache where planned;
        streamed tensors report to the compute hooks."""
        uses_gpu = any(t.tier == "gpu" or t.compute == "gpu" for t in self.plan.tensors)
        model = self._param_overrides.setdefault("model_params", {})
        context = self._param_overrides.setdefault("context_params", {})
        model["n_gpu_layers"] = self.plan.n_layer + 1 if uses_gpu else 0
        context["offload_kqv"] = uses_gpu and self.plan.kv_tier == "gpu"
        if has_gpu() and (paged or layout.layers(HOST_POOL)):
            # these CPU weights are valid only while their layer runs (hooks fill them): op offload would
            # copy them to the GPU for a prompt batch when the graph split starts, before they are filled.
            # A plan without GPU tensors too: llama.cpp offloads host weights' ops at -ngl 0 as well
            context["op_offload"] = False
        if any(t.tier == "disk" for t in self.plan.tensors) or not uses_gpu:
            # the page cache is not a hidden tier: nothing of the file is mapped or cached. Mapped, a CPU plan's
            # repacked weights were in RSS twice, the file's pages besides the repacked copy (2.26 GiB RSS for a
            # 2 GiB plan of the llama3.1-8b shape, 8 layers)
            model["load_mode"] = llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO

    def _wrap_decode(self) -> None:
        """Time every llama_decode for stats(), and raise a streaming failure right after it."""
        ctx = self._ctx
        decode = ctx.decode

        def timed_decode(batch):
            self._stats.timed(lambda: decode(batch), batch.n_tokens())
            self.raise_stream_error()
            self._drain_experts()

        ctx.decode = timed_decode

    def decode_tokens(self, tokens: list[int]) -> bool:
        """llama_decode `tokens` after those in the KV cache, then synchronize, as llama-bench and the
        C tools do (eval() also trims the cache before every batch); timed for stats(). False when
        llama_decode fails; raises when weights could not be streamed."""
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        ctx, rc = self._ctx.ctx, []

        def run():
            rc.append(llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens))))
            llama_cpp.llama_synchronize(ctx)

        self._stats.timed(run, len(tokens))
        self.raise_stream_error()
        self._drain_experts()
        return rc[0] == 0

    def decode_batch(self, batch, decode: bool = False) -> int:
        """llama_decode a prepared llama_batch (tokens of any sequences), then synchronize, timed for
        stats() as decode when `decode` (one new token per sequence) else as prefill. Returns
        llama_decode's status (0 ok, 1 no KV slot, < 0 error); raises when weights could not be streamed."""
        ctx, rc = self._ctx.ctx, []

        def run():
            rc.append(llama_cpp.llama_decode(ctx, batch))
            llama_cpp.llama_synchronize(ctx)

        self._stats.timed(run, batch.n_tokens, decode)
        self.raise_stream_error()
        self._drain_experts()
        return rc[0]

    def _drain_experts(self) -> None:
        """Replay what the stream answered in C during the decode: counters exact, the log bounded; the
        decode's routing is counted."""
        experts, recorder = self.__dict__.get("_experts"), self.__dict__.get("_recorder")
        if experts is not None:
            experts.drain()
        if recorder is not None:
            recorder.flush()

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """llama_cpp.Llama.tokenize with a buffer sized by the text: llama-cpp-python's holds the model's
        training context (its context_length) on every call, gigabytes where a file states billions."""
        n_max = len(text) + 3  # a token per byte at most, BOS, EOS and a space prefix
        tokens = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._model.vocab, text, len(text), tokens, n_max, add_bos, special)
        if n < 0:  # llama_tokenize asks for a buffer of -n tokens
            tokens = (llama_cpp.llama_token * -n)()
            n = llama_cpp.llama_tokenize(self._model.vocab, text, len(text), tokens, -n, add_bos, special)
        if n < 0:
            raise RuntimeError(f"Failed to tokenize: {len(text)} bytes of text, n_tokens={n}")
        return list(tokens[:n])

    def clear_memory(self) -> None:
        """Empty the KV cache (the next decode starts at position 0)."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx.ctx), True)
        self.reset()

    def raise_stream_error(self) -> None:
        """Raise if weights could not be streamed during the last decode (its results are void)."""
        if self._streamer is not None:
            self._streamer.raise_pending()

    def stats(self, reset: bool = False) -> dict:
        """Since load (or the last reset): prefill and decode tok/s, streamed bytes per token from
        each tier, stall ms per token, achieved GB/s per link, the plan's prediction, and memory
        (RSS now and at peak, GPU memory taken since load began) beside the plan's budgets."""
        out = self._stats.summary()
        experts = self.__dict__.get("_experts")
        if experts is not None:
            out["experts"] = experts.summary()
        pager = self.__dict__.get("_pager")
        if pager is not None:
            out["expert_paging"] = pager.summary()
        if reset:
            self._stats.reset()
            if experts is not None:
                experts.reset_stats()
            if pager is not None:
                pager.reset_stats()
        return out

    def probe_disk(self, seconds: float = 1.0) -> Optional[dict]:
        """GB/s that the disk gives this plan's expert reads now, read as a decode reads them (bursts of one
        layer's disk experts through the pager's readers); None when no expert lives on disk."""
        pager = self.__dict__.get("_pager")
        return pager.probe(seconds) if pager is not None else None

    def close(self) -> None:
        streamer = self.__dict__.get("_streamer")
        try:
            if streamer is not None:
                streamer.transfers.close()  # loads in flight finish before the pool they write is freed
            self._close_experts()
            pager, self._pager = self.__dict__.get("_pager"), None
            if pager is not None:
                pager.close()  # before the model goes: no read may land in freed memory
        finally:
            super().close()
            self._close_streamer()
            model, self._caches_of = self.__dict__.get("_caches_of"), None
            if model is not None:
                lib().hypura_expert_caches_free(model)  # after the context computing from them, with the model

    def _close_experts(self) -> None:
        """Loads finish, the recorded routing persists; the caches go with the model (after the context)."""
        experts, copies = self.__dict__.get("_experts"), self.__dict__.get("_expert_copies")
        self._experts = self._expert_copies = None
        if copies is not None:
            copies.close()
        self._recorder = None
        save = self.__dict__.get("_save_routing")
        if save is not None:
            save()  # once, though close() runs again

    def _close_streamer(self) -> None:
        # after the context: it calls into the stream until freed
        streamer, self._streamer = self.__dict__.get("_streamer"), None
        if streamer is not None:
            streamer.close()

    def __del__(self):
        # raising before llama_cpp.Llama.__init__ ran (bad file, bad -ot) leaves nothing to free
        if "_stack" in self.__dict__:
            super().__del__()
        self._close_streamer()

    def _c_model(self):
        """llama-cpp-python's model (a ctypes pointer) as our cffi `struct llama_model *`."""
        return ffi.cast("struct llama_model *", ctypes.cast(self.model, ctypes.c_void_p).value)

    def tensor_buffer(self, name: str) -> Optional[str]:
        """Name of the buffer type holding tensor `name` (e.g. "CPU", "CUDA0"), None if absent."""
        c_name = lib().hypura_model_tensor_buft(self._c_model(), name.encode())
        return None if c_name == ffi.NULL else ffi.string(c_name).decode()


def _save_routing(recorder: CoactivationRecorder, key: str) -> None:
    if recorder.recorded:
        try:
            recorder.predictor.save(key)
        except OSError as e:  # a cache that cannot be written costs the next plan its statistics, not this run
            warnings.warn(f"hypura: recorded routing not saved ({e}); the next run plans without it", stacklevel=2)
