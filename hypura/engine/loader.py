"""One way to load a model for the engine, its draft model when it speculates with one, and the engine on them
(the server and `hypura bench --parallel`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import llama_cpp

from hypura.engine.config import EngineConfig
from hypura.engine.engine import Engine
from hypura.engine.sizes import sizes
from hypura.errors import HypuraError
from hypura.loaded import Ask, load as load_model
from hypura.loaded.drafts import draft_model
from hypura.speculative.auto_draft import resolve

# one spare sequence id for embeddings (engine/embed.py): in a unified KV cache it costs no memory
EMBEDDING_SEQS = 1


def engine_llama_kwargs(parallel: int, n_ctx_per_seq: int, speculative: bool = False, **kwargs) -> dict:
    """hypura.Llama keywords (hypura.plan.ask.Ask.of's) for `parallel` sequences of `n_ctx_per_seq` tokens each,
    and one spare sequence id for embeddings (engine/embed.py): the decision makes them one unified KV cache of parallel x n_ctx_per_seq
    cells (sequences copy a shared prefix's cells instead of recomputing it), plans for steps of `parallel`
    tokens, and chooses the threads for them (hypura.plan.load_params). Flash attention is llama.cpp's default
    ("auto") unless asked otherwise: its CPU kernel leaves a sequence's attention independent of the others in
    the batch (docs/engine.md). Without a plan or budgets, every layer is offered to the GPU (n_gpu_layers=-1,
    as llama-server and Ollama serve), and the default path fits the model to the free memory or plans it there.
    speculative: steps verify drafts (several outputs a sequence), so a micro-batch the decision grows keeps
    llama.cpp's outputs for every token (n_outputs_max 0)."""
    if "n_ctx" in kwargs:
        raise HypuraError("give n_ctx_per_seq: the context is parallel x n_ctx_per_seq tokens")
    overrides = {name: dict(fields) for name, fields in (kwargs.pop("param_overrides", None) or {}).items()}
    context = overrides.setdefault("context_params", {})
    if "flash_attn" not in kwargs:
        context.setdefault("flash_attn_type", llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO)
    if speculative:
        context.setdefault("n_outputs_max", 0)
    kwargs["param_overrides"] = overrides
    kwargs.setdefault("n_gpu_layers", -1)  # a server's default: hypura.Llama's own stays llama-cpp-python's CPU
    kwargs.setdefault("verbose", False)
    return dict(kwargs, n_ctx=parallel * n_ctx_per_seq, parallel=parallel, spare_seqs=EMBEDDING_SEQS)


def load(model_path: str | os.PathLike, parallel: int = 4, n_ctx_per_seq: int = 4096,
         config: Optional[EngineConfig] = None, **llama_kwargs):
    """Load `model_path` (hypura.loaded.load: llama-cpp-python's keywords plus Hypura's: plan, gpu_mem, ram, ...)
    for `parallel` sequences of `n_ctx_per_seq` tokens, and start an Engine on it. Returns (the LoadedModel,
    engine); close the engine, then the model."""
    config = dataclasses.replace(config, parallel=parallel) if config else EngineConfig(parallel=parallel)
    if config.speculative is not None:  # a draft model loads after the model, in the room its decision kept
        llama_kwargs.setdefault("draft_beside", config.speculative.beside)
    if config.kv_unified:  # the sequences share the cells: the decision chooses how many, at most the context
        llama_kwargs.setdefault("kv_cells", True)
    llm = load_model(model_path, Ask.of(**engine_llama_kwargs(parallel, n_ctx_per_seq,
                                                              config.speculative is not None, **llama_kwargs)))
    draft = None
    try:
        # auto: the draft the decision found, n-gram drafting where the plan makes it pay, or none
        config = dataclasses.replace(config, speculative=resolve(config.speculative, llm))
        draft = load_draft(llm, config)
        engine = Engine(llm, config, draft).start()
    except BaseException:
        if draft is not None:
            draft.close()
        llm.close()
        raise
    return llm, engine


def load_draft(llm, config: EngineConfig):
    """The draft model a draft-simple `config.speculative` names (a hypura.speculative.DraftModel), loaded beside
    `llm` (hypura.loaded.drafts) with a KV sequence for each of the engine's slots, each as long as a slot's share
    of the target's cache, and the target's threads; None for any other config. Hand it to Engine(llm, config,
    draft), which closes it."""
    s = config.speculative
    if s is None or s.type != "draft-simple":
        return None
    size = sizes(llm, config)  # the engine's own check: a context it cannot run is refused before the draft loads
    n_ctx_per_seq = min(size.share, size.n_ctx_per_seq)
    return draft_model(s.draft_model, llm, config.parallel, s.p_min, n_ctx=config.parallel * n_ctx_per_seq,
                       n_threads=llm.context.n_threads, n_threads_batch=llm.context.n_threads_batch)
