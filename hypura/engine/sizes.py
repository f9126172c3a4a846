"""What the loaded context gives the engine, checked once when an Engine is made: the sequences, the tokens
each may hold, the tokens a step carries."""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp

from hypura.engine.config import EngineConfig
from hypura.errors import HypuraError


@dataclass(frozen=True)
class Sizes:
    unified: bool  # one KV cache shared by all sequences (else a stream each)
    share: int  # a sequence's share of the cache: n_ctx / parallel (a stream's size when split)
    n_ctx_per_seq: int  # tokens a sequence may hold (prompt and generated)
    step_tokens: int  # tokens one llama_decode carries


def seq_limit(n_cells: int, n_ctx_train: int, share: int) -> int:
    """Tokens one sequence may hold when the sequences share the cache's cells (EngineConfig.kv_unified): the
    whole cache, up to the training context (never less than its share, which the user may have asked for
    past that context)."""
    return min(n_cells, max(n_ctx_train or n_cells, share))


def sizes(llm, config: EngineConfig) -> Sizes:
    """llm: a hypura.loaded.LoadedModel; raises HypuraError where its context cannot run `config`."""
    kv = llm.context
    n_seq = kv.n_seq_max
    if n_seq < config.parallel:
        raise HypuraError(f"the model's context holds {n_seq} sequences, fewer than parallel {config.parallel}: load "
                          "it with parallel=N (hypura.engine.load does)")
    outputs, spec = llm.context_params.n_outputs_max, config.speculative
    if spec is not None and 0 < outputs < config.parallel * spec.pass_rows:  # llama.cpp would abort mid-step
        raise HypuraError(f"the model's context computes at most {outputs} outputs a step, fewer than verifying "
                          f"{config.parallel} sequences' drafts: load it with engine_llama_kwargs(..., "
                          "speculative=True) (hypura.engine.load does)")
    unified = bool(llm.context_params.kv_unified)
    # a unified cache is shared by all sequences; each stream of a split one holds its sequence only
    share = per_seq = kv.n_ctx() // config.parallel if unified else kv.n_ctx_seq
    if config.kv_unified:  # a sequence may hold the whole cache (admission.py)
        if not unified:
            raise HypuraError("kv_unified shares one unified KV cache: load the model with kv_unified "
                              "(hypura.engine.load does)")
        per_seq = seq_limit(kv.n_ctx(), llama_cpp.llama_model_n_ctx_train(llm.model.model), share)
    n_ctx_per_seq = min(per_seq, config.n_ctx_per_seq or per_seq)
    if n_ctx_per_seq < 2:
        raise HypuraError(f"a context of {kv.n_ctx()} leaves {per_seq} tokens to each of "
                          f"{config.parallel} sequences: give a larger n_ctx")
    n_batch = kv.n_batch
    step_tokens = config.step_tokens or n_batch
    if step_tokens > n_batch or step_tokens < config.parallel:
        raise HypuraError(f"step_tokens {step_tokens} must lie within parallel {config.parallel} and the "
                          f"context's n_batch {n_batch}")
    return Sizes(unified, share, n_ctx_per_seq, step_tokens)
