"""`hypura.Llama`: llama-cpp-python's `Llama`, loaded through Hypura's placement hooks.

Same constructor, methods and return shapes as `llama_cpp.Llama` (it is a subclass), so code
written for llama-cpp-python runs unchanged. The model file is checked in Python first, and
every tensor's placement goes through `hypura.runtime.placement.LoaderHooks`.

It is an adapter over the model Hypura owns: the constructor loads a hypura.loaded.LoadedModel (llama_cpp.Llama's
keywords and Hypura's: the one decision, the Runtime, llama.cpp's model and context) and fills the state
llama_cpp.Llama's methods read from it: its model and context owners, a batch, generation state and chat formats.
This is the one file that writes llama-cpp-python's private attributes (tests/test_layers.py holds every other
file to that). The context's decode is Runtime.decode, so eval() and embed() are timed and checked as every other.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from typing import Callable, Iterable, Optional, Union

import numpy as np

import llama_cpp
import llama_cpp._internals as internals  # the model and context owners llama_cpp.Llama's methods use
from llama_cpp import LlamaTokenizer

from hypura.bindings.batch import Batch
from hypura.bindings.chat_formats import chat_formats
from hypura.bindings.llama_params import threads
from hypura.loaded import Ask, LoadedModel, load
from hypura.plan.auto import Fit
from hypura.runtime.moe.expert_streaming import ExpertCacheSettings
from hypura.runtime.placement import PlacementPolicy
from hypura.speculative.auto_draft import is_auto
from hypura.llama_speculative import SpecDraft
from hypura.loaded.drafts import draft_path


def _loaded(name: str) -> property:
    return property(lambda self: getattr(self.loaded, name))


class Llama(llama_cpp.Llama):
    # what close() and __del__ read, before __init__ sets them (it may raise first)
    loaded: Optional[LoadedModel] = None
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
            measured cost (hypura.llama_speculative), and stats()["speculative"] reports them. "auto": a
            draft found in the stores (hypura.speculative.auto_draft: where the plan streams weights, a model with this
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
            hypura.speculative.auto_draft.AutoDraft: one found as for draft_model="auto" (`draft_found`).

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

        vocab_only: as llama_cpp.Llama, the vocabulary alone (of a model, or of a vocabulary-only GGUF, which holds no
            tensor): nothing is planned or placed.

        Raises ModelFileError (a ValueError) for a missing, non-GGUF, truncated or
        unsupported file, before llama.cpp reads it.
        """
        draft = kwargs.get("draft_model")
        tree = getattr(draft, "context_params", None)  # a DraftTree's: a sequence per branch in the target's cache
        if tree and (param_overrides is None or isinstance(param_overrides, dict)):
            param_overrides = {name: dict(fields) for name, fields in (param_overrides or {}).items()}
            for key, value in tree.items():
                param_overrides.setdefault("context_params", {}).setdefault(key, value)
        self.loaded = loaded = load(model_path, Ask.of(
            **kwargs, override_tensor=override_tensor, placement_policy=placement_policy, gpu_mem=gpu_mem, ram=ram,
            plan=plan, param_overrides=param_overrides, on_route=on_route, expert_cache=expert_cache, fit=fit,
            profile=profile, draft_beside=draft_beside or draft_path(draft), rpc_servers=rpc_servers, devices=devices,
            rpc_mem=rpc_mem, split=split, parallel=max(parallel, getattr(draft, "branches", 1)),  # a DraftTree's
            spare_seqs=spare_seqs))
        try:
            self._fill(loaded)
            if is_auto(draft):  # the draft the decision found (or none: no speculation)
                self.draft_model = str(loaded.draft_found) if loaded.draft_found else None
            if self.draft_model is not None:  # after the load: a draft model's vocabulary is checked against ours
                self.draft_model = SpecDraft(self.draft_model, self)
        except BaseException:
            loaded.close()  # the model, context and streams go with the failed constructor
            raise

    def _fill(self, loaded: LoadedModel) -> None:
        """llama_cpp.Llama's state over the loaded model: its model and context owners, a batch, generation
        state, tokenizer, chat formats and sampling settings (tests/test_llama_state.py lists what its methods
        read)."""
        k = loaded.keywords
        self.verbose, self.model_path = k["verbose"], loaded.path
        self.numa = k["numa"] if not isinstance(k["numa"], bool) else (
            llama_cpp.GGML_NUMA_STRATEGY_DISTRIBUTE if k["numa"] else llama_cpp.GGML_NUMA_STRATEGY_DISABLED)
        self.model_params, self.context_params = loaded.model_params, loaded.context_params
        self.tensor_split, self.kv_overrides = k["tensor_split"], k["kv_overrides"]
        self.n_threads, self.n_threads_batch = threads(k)
        self.n_batch = self.context_params.n_batch
        self._model, self._ctx = loaded.model, loaded.context.owner
        self._stack = contextlib.ExitStack()  # their close() reads it; ours closes the loaded model instead
        self._batch = internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=self.context_params.n_ctx,
                                           verbose=self.verbose)
        loaded.own(self._batch.close)
        self.lora_base, self.lora_scale, self.lora_path = k["lora_base"], k["lora_scale"], k["lora_path"]
        self._lora_adapter = loaded.lora_adapter
        if self.verbose:
            print(llama_cpp.llama_print_system_info().decode("utf-8"), file=sys.stderr)
        self.vocab = loaded.vocab
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

    # --- Hypura's, from the loaded model (hypura.loaded.LoadedModel's attributes of the same names) ----------
    header = _loaded("header")
    decision = _loaded("decision")
    plan = _loaded("plan")
    fit_decision = _loaded("fit_decision")  # what the default path or the budgets chose; None where placement was given
    placement = _loaded("placement")  # tensor name -> Placement
    draft_found = _loaded("draft_found")  # the draft "auto" found (a Path), else None

    @property
    def _runtime(self):
        return self.loaded.runtime if self.loaded is not None else None

    @property
    def _pager(self):
        return self._runtime.pager if self._runtime is not None else None

    @property
    def last_decode_seconds(self) -> float:
        """The last llama_decode of eval (a verification pass's cost, for drafting)."""
        return self.loaded.context.last_decode_seconds

    def decode_tokens(self, tokens: list[int], decode: Optional[bool] = None) -> bool:
        """LoadedModel.decode_tokens (eval() also trims the cache before every batch)."""
        return self.loaded.decode_tokens(tokens, decode)

    def decode_batch(self, batch: Batch, decode: bool = False) -> int:
        """LoadedModel.decode_batch."""
        return self.loaded.decode_batch(batch, decode)

    def eval(self, tokens) -> None:
        """llama_cpp.Llama.eval, unless a draft tree verifies its tree in this pass (hypura.llama_speculative): then
        the state holds what a chain pass would leave, the accepted path's tokens and logits after n_tokens."""
        eval_tree = getattr(self.draft_model, "eval_tree", None)
        done = eval_tree(tokens, self.n_tokens, self._sampler) if eval_tree is not None else None
        if done is None:
            super().eval(tokens)
            return
        path, logits = done
        n_past = self.n_tokens
        self.input_ids[n_past: n_past + len(path)] = path
        if self._logits_all:
            self.scores[n_past: n_past + len(path), :] = logits
        self.n_tokens = n_past + len(path)
        self._requires_eval = False

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """llama_cpp.Llama.tokenize with a buffer sized by the text (hypura.bindings.vocab)."""
        return self.vocab.tokenize(text, add_bos, special)

    def clear_memory(self) -> None:
        """Empty the KV cache (the next decode starts at position 0)."""
        self.loaded.context.clear()
        self.reset()

    def raise_stream_error(self) -> None:
        """Raise if weights could not be streamed during the last decode (its results are void)."""
        self.loaded.raise_stream_error()

    def stats(self, reset: bool = False) -> dict:
        """Since load (or the last reset): prefill and decode tok/s, streamed bytes per token from
        each tier, stall ms per token, achieved GB/s per link, the plan's prediction, and memory
        (RSS now and at peak, GPU memory taken since load began) beside the plan's budgets."""
        out = self.loaded.stats(reset)
        draft = self.draft_model
        if getattr(draft, "stats", None) is not None:
            out["speculative"] = draft.stats.summary()
            if reset:
                draft.reset_stats()
        return out

    def probe_disk(self, seconds: float = 1.0) -> Optional[dict]:
        """GB/s that the disk gives this plan's expert reads now, read as a decode reads them (bursts of one
        layer's disk experts through the pager's readers); None when no expert lives on disk."""
        return self.loaded.probe_disk(seconds)

    def close(self) -> None:
        """Hypura's threads and reads stop, then llama.cpp's context and model go, then the pools; twice is safe."""
        close_draft = getattr(self.draft_model, "close", None)
        if close_draft is not None:
            close_draft()
        if self.loaded is not None:  # None: the load never began (llama.cpp holds nothing)
            self.loaded.close()

    def __del__(self):
        # raising before the runtime was built (bad file, bad -ot) leaves nothing to free
        self.close()

    def tensor_buffer(self, name: str) -> Optional[str]:
        """Name of the buffer type holding tensor `name` (e.g. "CPU", "CUDA0"), None if absent."""
        return self.loaded.tensor_buffer(name)
