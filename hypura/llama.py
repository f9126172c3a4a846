"""`hypura.Llama`: llama-cpp-python's `Llama`, loaded through Hypura's placement hooks.

Same constructor, methods and return shapes as `llama_cpp.Llama` (it is a subclass), so code
written for llama-cpp-python runs unchanged. The model file is checked in Python first, and
every tensor's placement goes through `hypura.runtime.placement.LoaderHooks`.

The constructor is Hypura's own: it takes llama_cpp.Llama's keywords (hypura.bindings.llama_params), makes
the one decision (hypura.plan.decision), sets what the Runtime needs over llama.cpp's params structs, and
builds the state llama_cpp.Llama's methods read: the model and context as its `_internals` owners, in
`self._stack` (the Runtime closes it before the layer stream and the expert caches), the batch, generation
state and chat formats (hypura.bindings.model, llama_params, chat_formats).
The context's decode is Runtime.decode, so eval() and embed() are timed and checked as every other decode.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import sys
import time
from typing import Callable, Iterable, Optional, Union

import numpy as np

from hypura.bindings.ffi import ffi, lib
import llama_cpp  # noqa: E402
import llama_cpp._internals as internals  # noqa: E402  (the model and context owners llama_cpp.Llama's methods use)
from llama_cpp import LlamaTokenizer  # noqa: E402
from llama_cpp.llama import set_verbose  # noqa: E402

from hypura.bindings.batch import Batch  # noqa: E402
from hypura.bindings.chat_formats import chat_formats  # noqa: E402
from hypura.bindings.llama_params import context_params, llama_keywords, model_params, set_fields, threads  # noqa: E402
from hypura.bindings.model import load_model, new_context  # noqa: E402
from hypura.bindings.llama_log import LogCapture  # noqa: E402
from hypura.bindings.vocab import Vocab  # noqa: E402
from hypura.errors import HypuraError  # noqa: E402
from hypura.modelfile import read_header  # noqa: E402
from hypura.plan.auto import Fit  # noqa: E402
from hypura.plan.beside import Beside  # noqa: E402
from hypura.plan.decision import Ask, Decision, Routing, decide  # noqa: E402
from hypura.plan.microbatch import outputs_needed  # noqa: E402
from hypura.runtime.moe.expert_streaming import ExpertCacheSettings  # noqa: E402
from hypura.runtime.devices import DeviceAsk, DeviceChoice, choose as choose_devices  # noqa: E402
from hypura.runtime.overrides import overrides_policy  # noqa: E402
from hypura.runtime.placement import Placement, PlacementPolicy  # noqa: E402
from hypura.runtime.runtime import Runtime, as_model_pointer  # noqa: E402
from hypura.speculative.auto import is_auto  # noqa: E402
from hypura.speculative.draft_model import draft_path  # noqa: E402
from hypura.store import resolve_path  # noqa: E402

def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Context(internals.LlamaContext):
    """llama-cpp-python's context, whose decode (eval's and embed's) is Runtime.decode: timed for stats(), and a
    streaming failure raises right after it."""

    def __init__(self, *, runtime: Runtime, **kwargs):
        super().__init__(**kwargs)
        self.runtime = runtime
        self.last_decode_seconds = 0.0

    def decode(self, batch: internals.LlamaBatch) -> None:
        t0 = time.perf_counter()
        rc = self.runtime.decode(self.ctx, Batch.view(batch.batch))
        self.last_decode_seconds = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")


class Llama(llama_cpp.Llama):
    # what close() and __del__ read, before __init__ sets them (it may raise first)
    _runtime: Optional[Runtime] = None
    draft_model = None

    def __init__(
        self,
        model_path: str,
        *,
        override_tensor: Union[str, Iterable[str], None] = None,
        placement_policy: Optional[PlacementPolicy] = None,
        gpu_mem: Union[int, str, None] = None,
        ram: Union[int, str, None] = None,
        plan=None,
        param_overrides: Optional[dict] = None,
        on_route: Optional[Callable[[int, "np.ndarray"], None]] = None,
        expert_cache: Union[ExpertCacheSettings, int, None] = None,
        fit: Union[Fit, bool] = True,
        profile=None,
        draft_beside: Union[str, os.PathLike, None] = None,
        rpc_servers: Union[str, Iterable[str], None] = None,
        devices: Optional[Iterable[str]] = None,
        rpc_mem: Optional[Iterable[Union[int, str]]] = None,
        split: bool = False,
        parallel: int = 1,
        spare_seqs: int = 0,
        **kwargs,
    ):
        """Load `model_path` as `llama_cpp.Llama` does (or a model named as Ollama names it, e.g.
        "qwen3:30b-a3b", from the stores hypura.store searches), plus Hypura's keyword arguments:

        override_tensor: llama.cpp's `-ot`, "PATTERN=BUFFER_TYPE[,...]" or a list of them.
        placement_policy: a callable TensorInfo -> Placement deciding each tensor's tier
            (default: llama.cpp's own placement, with `override_tensor` applied).
        plan: a hypura.plan.Plan, a plan file (`hypura inspect --json`), or "auto"; with
            gpu_mem/ram budgets ("8GiB") and no plan, one is made now from the cached machine
            profile. Without any of them (and no placement_policy, override_tensor, or n_gpu_layers other
            than 0 and -1), the default path (`fit`) decides.
            A plan sets n_gpu_layers and offload_kqv itself, and streams the layers it does not
            keep resident through pool slots (hypura.runtime.dense.layer_streamer).
        param_overrides: {"model_params": {...}, "context_params": {...}}: fields of llama.cpp's
            params structs that llama-cpp-python does not expose (e.g. load_mode,
            flash_attn_type), set over its defaults; one that contradicts what the plan needs is
            refused (HypuraError; the precedence is in hypura.runtime.params).
        on_route: MoE models: called as on_route(layer, ids) with each layer's chosen experts
            ([n_tokens, n_expert_used] int32) once per layer and batch, before the expert matmuls.
        n_threads: unset, llama.cpp's default (physical cores; llama-cpp-python guesses half the logical
            CPUs), less a quarter when the plan pages experts from disk (their reads need cores).
        n_threads_batch: unset, as n_threads where Hypura chose that, experts page or several sequences decode
            together (`parallel`); else llama-cpp-python's default (all logical CPUs).
        fit: llama.cpp's --fit (hypura.plan.auto): on the default path, a model that fits the free memory
            (less margins) at its context loads as llama.cpp places it; one that does not is planned within
            it, disk for the rest. n_gpu_layers=-1 plans over GPU, RAM and disk; 0 (the default: the CPU)
            over RAM and disk, streamed with O_DIRECT, never paged through mmap. n_ctx=0 lets it choose the
            context (>= fit.min_ctx). False: llama.cpp's placement as given. A Fit sets margins and minimum.
        draft_model: speculative decoding, verified in one pass by llama-cpp-python's generate loop: a
            llama_cpp.llama_speculative.LlamaDraftModel (e.g. LlamaPromptLookupDecoding(num_pred_tokens=10)),
            a Hypura drafter (hypura.speculative: NgramSimple, PromptLookup, DraftModel) or a draft GGUF's
            path (its vocabulary must be this model's), or a hypura.speculative.DraftTree (a draft GGUF's
            trees of candidates, verified in one pass); the draft length or tree size follows the passes'
            measured cost (hypura.speculative.llama_draft), and stats()["speculative"] reports them. "auto": a
            draft found in the stores (hypura.speculative.auto: where the plan streams weights, a model with this
            one's vocabulary, planned beside it, kept where the cost model predicts a gain; `draft_found` names it,
            None when none was kept: then no speculation).
        profile: the hypura.profile.MachineProfile plans are made with (default: this machine's cached one,
            measured now on first use).
        expert_cache: MoE models: slots per layer (or ExpertCacheSettings) of an expert cache in GPU
            memory (host memory without a GPU) that decode computes from; the stacked experts stay
            in host memory and load into slots on demand or ahead (hypura.runtime.moe.expert_streaming).

        draft_beside: a draft GGUF that will be loaded beside this model (hypura-cli's -md, the engine's
            speculation; a draft_model given as a path or a DraftTree sets it): the decision keeps its memory
            within the budgets or the free memory, on the GPU or in RAM, whichever the plans predict makes
            the faster speculative pass (hypura.plan.beside), and the draft loads there. "auto" or a
            hypura.speculative.auto.AutoDraft: one found as for draft_model="auto" (`draft_found`).

        rpc_servers: llama.cpp RPC servers, "host:port,host:port" (llama-cpp-python's keyword; `--rpc`) or a list:
            each is probed (a dead one is a HypuraError, never a hang) and its devices registered. With
            n_gpu_layers=-1 and no tensor_split, devices or other placement, Hypura splits the layers over them
            and this machine (hypura.plan.shares; docs/devices.md) within gpu_mem (each local GPU's; "8GiB,8GiB"
            one each) and ram. rpc_mem: a budget per RPC device ("2GiB").
        devices: llama.cpp's `--device` list (["CUDA1", "RPC0"], ["none"]): the devices llama.cpp offloads to.
        split: the same split over this machine's GPUs without RPC servers (several GPUs; otherwise the first GPU's
            plan, as before).
        parallel: sequences decoded together (the engine's batch, a draft tree's branches): a plan is made for steps
            of that many tokens; with spare_seqs (sequence ids that decode nothing in a step, e.g. the engine's
            embeddings), llama.cpp's n_seq_max, in one unified KV cache (hypura.plan.load_params).

        Raises ModelFileError (a ValueError) for a missing, non-GGUF, truncated or
        unsupported file, before llama.cpp reads it.
        """
        self._stack = contextlib.ExitStack()  # llama.cpp's model, context and batch, closed by the runtime
        model_path = str(resolve_path(model_path))  # a path, or a model's name (hypura.store)
        k = llama_keywords(model_path, kwargs)  # raises TypeError for an argument llama_cpp.Llama does not take
        self.header = read_header(model_path)
        lib()  # fail clearly now if the library lacks the hooks
        self.gpu_mem, self.ram = gpu_mem, ram
        if param_overrides is not None and not isinstance(param_overrides, dict):
            raise HypuraError("param_overrides takes a dict: {\"model_params\": {...}, \"context_params\": {...}}")
        # copies, never the caller's: the decision's context goes into them
        param_overrides = {name: dict(fields) for name, fields in (param_overrides or {}).items()}
        fit = fit if isinstance(fit, Fit) else Fit(enabled=bool(fit))
        for key, value in getattr(kwargs.get("draft_model"), "context_params", {}).items():  # a DraftTree's
            param_overrides.setdefault("context_params", {}).setdefault(key, value)
        parallel = max(parallel, getattr(kwargs.get("draft_model"), "branches", 1))  # a DraftTree's branches
        if placement_policy is not None and override_tensor is not None:
            raise HypuraError("give one of plan (or gpu_mem/ram budgets), placement_policy and override_tensor")
        placed = placement_policy is not None or override_tensor is not None
        self.device_choice = self._devices(DeviceAsk(rpc_servers, None if devices is None else list(devices),
                                                     None if rpc_mem is None else list(rpc_mem), split),
                                           k, param_overrides, placed or plan is not None
                                           or expert_cache is not None or not fit.enabled, fit, profile)
        if self.device_choice.shares is not None:  # the split took the budgets: the decision is llama.cpp's placement
            self.gpu_mem = self.ram = None
        self.decision = decision = self._decide(k, param_overrides, plan, placed or bool(rpc_servers)
                                                or devices is not None or split, expert_cache is not None, fit, profile,
                                                draft_beside or draft_path(kwargs.get("draft_model")),
                                                dict(parallel=parallel, spare_seqs=spare_seqs))
        if is_auto(k.get("draft_model")):  # the draft the decision found (or none: no speculation)
            k["draft_model"] = str(self.draft_found) if self.draft_found else None
        self.fit_decision = decision if decision.line else None  # what the default path or the budgets chose
        self.plan = decision.plan
        k.update(decision.params.keywords())  # the context, its batches and the threads (hypura.plan.load_params)
        context = param_overrides.setdefault("context_params", {})
        if "n_ctx" in context:
            context["n_ctx"] = decision.n_ctx
        if isinstance(expert_cache, int):
            expert_cache = ExpertCacheSettings(slots=expert_cache)
        self._runtime = runtime = Runtime(self.header, model_path, self.plan,
                                          placement_policy or overrides_policy(override_tensor), decision.params,
                                          param_overrides, expert_cache, on_route)
        say = fit.say or (_stderr if k["verbose"] else None)
        if runtime.reads is not None and say is not None:
            say(runtime.reads.line)
        runtime.own(self._stack.close)  # first at close: before the layer stream and expert caches
        with runtime.loading() as hooks:
            self._load(model_path, k, runtime.params.merged())
        self.placement: dict[str, Placement] = {name: p for name, (_, p) in hooks.placed.items()}
        try:
            runtime.attach(self._c_model())
            self._init_state(k)
            if self.draft_model is not None:  # after the load: a draft model's vocabulary is checked against ours
                from hypura.speculative.llama_draft import SpecDraft

                self.draft_model = SpecDraft(self.draft_model, self)
        except BaseException:
            runtime.close()  # the model, context and streams go with the failed constructor
            raise

    def _devices(self, ask: DeviceAsk, k: dict, overrides: dict, placed: bool, fit: Fit, profile) -> DeviceChoice:
        """The devices the model loads onto (hypura.runtime.devices): llama.cpp's default unless RPC servers or a
        device list are given; RPC servers are placement as given to the decision (llama.cpp's, or the split)."""
        from hypura.profile.measure import planning_profile

        say = fit.say or (_stderr if k["verbose"] else None)
        return choose_devices(self.header, ask, k, overrides, placed=placed, ram=self.ram, gpu_mem=self.gpu_mem,
                              say=say, warn=fit.say, profile=lambda: profile or planning_profile(self.header.path, say,
                                                                          measure=fit.measure_profile))

    def _decide(self, k: dict, overrides: dict, plan, placed: bool, expert_cache: bool, fit: Fit,
                profile, draft, asked: dict) -> Decision:
        """The one decision (hypura.plan.decision) from these keywords; its line said where verbose."""
        from hypura.profile.free import free_memory
        from hypura.profile.measure import planning_profile
        from hypura.runtime.moe.coactivation import routing_frequencies

        model, context = overrides.get("model_params", {}), overrides.get("context_params", {})
        say = fit.say or (_stderr if k["verbose"] else None)
        n_ubatch = context.get("n_ubatch", k["n_ubatch"])
        # every row where llama-cpp-python's logits_all, embeddings or a draft verified in the pass read them
        outputs = outputs_needed(context, bool(k["logits_all"] or k["embedding"] or k["draft_model"] is not None),
                                 asked["parallel"] + asked["spare_seqs"])
        ask = Ask(plan=plan, gpu_mem=self.gpu_mem, ram=self.ram, n_ctx=context.get("n_ctx", k["n_ctx"]) or 0,
                  n_ubatch=n_ubatch, n_outputs=outputs, n_gpu_layers=model.get("n_gpu_layers", k["n_gpu_layers"]),
                  placement=placed, expert_cache=expert_cache, fit=fit,
                  n_batch=context.get("n_batch", k["n_batch"]), n_threads=k["n_threads"],
                  n_threads_batch=k["n_threads_batch"], param_overrides=overrides, **asked)
        machine = profile or functools.cache(lambda: planning_profile(self.header.path, say, measure=fit.measure_profile))

        def decide_beside(beside: Optional[Beside]) -> Decision:
            return decide(self.header, dataclasses.replace(ask, beside=beside), lambda: fit.free or free_memory(),
                          machine, routing=lambda: Routing(*routing_frequencies(self.header)))

        self.draft_found = None
        if is_auto(draft):  # a draft from the stores, planned beside; kept where the cost model predicts a gain
            from hypura.speculative.auto import AutoDraft, find_draft

            decision = decide_beside(None)
            found = find_draft(self.header, decision, decide_beside, draft if isinstance(draft, AutoDraft)
                               else AutoDraft(), n_ubatch)
            if found is not None:
                decision, self.draft_found = found.decision, found.path
                if say is not None:
                    say(found.line())
        else:
            decision = decide_beside(Beside.of(read_header(draft), n_ubatch) if draft else None)
        if decision.line and say is not None:
            say(decision.line)
        return decision

    def _load(self, model_path: str, k: dict, fields: dict) -> None:
        """llama.cpp's model, context and batch, built as llama_cpp.Llama builds them from keywords `k`, with
        Hypura's `fields` set over its params structs (hypura.runtime.params), owned by self._stack."""
        self.verbose, self.model_path = k["verbose"], model_path
        set_verbose(self.verbose)
        self.numa = k["numa"] if not isinstance(k["numa"], bool) else (
            llama_cpp.GGML_NUMA_STRATEGY_DISTRIBUTE if k["numa"] else llama_cpp.GGML_NUMA_STRATEGY_DISABLED)
        if self.numa != llama_cpp.GGML_NUMA_STRATEGY_DISABLED:
            llama_cpp.llama_numa_init(self.numa)
        self._param_arrays = model_params(k)  # the struct and the arrays it points into, alive as long
        self.model_params = self._param_arrays.params
        self._device_array = self.device_choice.array()  # alive as long as the params that point at it
        if self._device_array is not None:
            self.model_params.devices = int(ffi.cast("uintptr_t", self._device_array))
        set_fields(self.model_params, fields["model_params"])
        self.tensor_split, self.kv_overrides = k["tensor_split"], k["kv_overrides"]
        self.n_threads, self.n_threads_batch = threads(k)
        log = LogCapture()  # llama.cpp says why a load failed only in its log
        try:
            with log:
                self._model = load_model(self._stack, model_path, self.model_params, self.verbose)
                self.context_params = context_params(k, self._model.n_ctx_train())
                set_fields(self.context_params, fields["context_params"])
                self.n_batch = self.context_params.n_batch
                self._ctx = new_context(self._stack, self._model, self.context_params, self.verbose, _Context,
                                        runtime=self._runtime)
            log.replay()
        except Exception as e:
            clearer = log.failure(e, model_path)
            if clearer is not None:
                raise clearer from None
            raise
        self._batch = self._stack.enter_context(contextlib.closing(internals.LlamaBatch(
            n_tokens=self.n_batch, embd=0, n_seq_max=self.context_params.n_ctx, verbose=self.verbose)))
        self._load_lora(k)

    def _load_lora(self, k: dict) -> None:
        self.lora_base, self.lora_scale, self.lora_path = k["lora_base"], k["lora_scale"], k["lora_path"]
        self._lora_adapter = None
        if not self.lora_path:
            return
        self._lora_adapter = llama_cpp.llama_adapter_lora_init(self._model.model, self.lora_path.encode("utf-8"))
        if self._lora_adapter is None:
            raise RuntimeError(f"Failed to initialize LoRA adapter from lora path: {self.lora_path}")
        self._stack.callback(llama_cpp.llama_adapter_lora_free, self._lora_adapter)  # first at close, as theirs
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self._lora_adapter)
        if llama_cpp.llama_set_adapters_lora(self._ctx.ctx, adapters, 1, (ctypes.c_float * 1)(self.lora_scale)):
            raise RuntimeError(f"Failed to set LoRA adapter from lora path: {self.lora_path}")

    def _init_state(self, k: dict) -> None:
        """What llama_cpp.Llama's methods read besides the model and context: generation state, tokenizer,
        chat formats, sampling settings (tests/test_llama_state.py lists them from its source)."""
        if self.verbose:
            print(llama_cpp.llama_print_system_info().decode("utf-8"), file=sys.stderr)
        self.vocab = Vocab(self.model)
        self.tokenizer_ = k["tokenizer"] or LlamaTokenizer(self)
        self.draft_model, self.cache = k["draft_model"], None
        self._seed = k["seed"] or llama_cpp.LLAMA_DEFAULT_SEED
        self._logits_all = k["logits_all"] if k["draft_model"] is None else True
        self.last_n_tokens_size, self.spm_infill = k["last_n_tokens_size"], k["spm_infill"]
        self._n_vocab, self._n_ctx = self.n_vocab(), self.n_ctx()
        self._token_nl, self._token_eos = self.token_nl(), self.token_eos()
        self._candidates = internals.LlamaTokenDataArray(n_vocab=self._n_vocab)
        self.n_tokens, self._requires_eval = 0, True  # a restored or trimmed state decodes before it samples
        n_ctx = self.context_params.n_ctx
        self.input_ids = np.ndarray((n_ctx,), dtype=np.intc)
        self.scores = np.ndarray((n_ctx if k["logits_all"] else self.n_batch, self._n_vocab), dtype=np.single)
        self._mirostat_mu = ctypes.c_float(2.0 * 5.0)  # llama-cpp-python's: 2 tau, its default tau
        self._sampler = None
        try:
            self.metadata = self._model.metadata()
        except Exception as e:
            self.metadata = {}
            if self.verbose:
                print(f"Failed to load metadata: {e}", file=sys.stderr)
        if self.verbose:
            print(f"Model metadata: {self.metadata}", file=sys.stderr)
        formats = chat_formats(self.metadata, k["chat_format"], k["chat_handler"], self.token_eos(),
                               self.token_bos(), self._model.token_get_text, self.verbose)
        self.chat_format, self.chat_handler, self._chat_handlers = formats.chat_format, k["chat_handler"], formats.handlers
        self._is_recurrent = llama_cpp.llama_model_is_recurrent(self._model.model)
        self._is_hybrid = llama_cpp.llama_model_is_hybrid(self._model.model)

    @property
    def _pager(self):
        return self._runtime.pager if self._runtime is not None else None

    @property
    def last_decode_seconds(self) -> float:
        """The last llama_decode of eval (a verification pass's cost, for drafting)."""
        return self._ctx.last_decode_seconds

    def decode_tokens(self, tokens: list[int], decode: Optional[bool] = None) -> bool:
        """llama_decode `tokens` after those in the KV cache, then synchronize, as llama-bench and the
        C tools do (eval() also trims the cache before every batch); timed for stats() as decode or prefill
        (`decode`; unset: one token is decode). False when llama_decode fails; raises when weights could not
        be streamed."""
        return self._runtime.decode(self.ctx, Batch.of(tokens), decode) == 0

    def decode_batch(self, batch: Batch, decode: bool = False) -> int:
        """llama_decode a prepared batch (tokens of any sequences), then synchronize, timed for stats() as
        decode when `decode` (one new token per sequence) else as prefill. Returns llama_decode's status (0 ok,
        1 no KV slot, < 0 error); raises when weights could not be streamed."""
        return self._runtime.decode(self.ctx, batch, decode)

    def eval(self, tokens) -> None:
        """llama_cpp.Llama.eval, unless a draft tree verifies its tree in this pass (hypura.speculative.llama_tree)."""
        eval_tree = getattr(self.draft_model, "eval_tree", None)
        if eval_tree is None or not eval_tree(tokens):
            super().eval(tokens)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """llama_cpp.Llama.tokenize with a buffer sized by the text (hypura.bindings.vocab)."""
        return self.vocab.tokenize(text, add_bos, special)

    def clear_memory(self) -> None:
        """Empty the KV cache (the next decode starts at position 0)."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx.ctx), True)
        self.reset()

    def raise_stream_error(self) -> None:
        """Raise if weights could not be streamed during the last decode (its results are void)."""
        self._runtime.raise_stream_error()

    def stats(self, reset: bool = False) -> dict:
        """Since load (or the last reset): prefill and decode tok/s, streamed bytes per token from
        each tier, stall ms per token, achieved GB/s per link, the plan's prediction, and memory
        (RSS now and at peak, GPU memory taken since load began) beside the plan's budgets."""
        out = self._runtime.summary(reset)
        draft = self.draft_model
        if getattr(draft, "stats", None) is not None:
            out["speculative"] = draft.stats.summary()
            if reset:
                draft.reset_stats()
        return out

    def probe_disk(self, seconds: float = 1.0) -> Optional[dict]:
        """GB/s that the disk gives this plan's expert reads now, read as a decode reads them (bursts of one
        layer's disk experts through the pager's readers); None when no expert lives on disk."""
        return self._runtime.probe_disk(seconds)

    def close(self) -> None:
        """Hypura's threads and reads stop, then llama.cpp's context and model go, then the pools; twice is safe."""
        close_draft = getattr(self.draft_model, "close", None)
        if close_draft is not None:
            close_draft()
        if self._runtime is not None:  # None: the load never began (llama.cpp holds nothing)
            self._runtime.close()  # self._stack (model, context, batch) closes inside, in its place

    def __del__(self):
        # raising before the runtime was built (bad file, bad -ot) leaves nothing to free
        self.close()

    def _c_model(self):
        """llama-cpp-python's model (a ctypes pointer) as our cffi `struct llama_model *`."""
        return as_model_pointer(self.model)

    def tensor_buffer(self, name: str) -> Optional[str]:
        """Name of the buffer type holding tensor `name` (e.g. "CPU", "CUDA0"), None if absent."""
        c_name = lib().hypura_model_tensor_buft(self._c_model(), name.encode())
        return None if c_name == ffi.NULL else ffi.string(c_name).decode()

