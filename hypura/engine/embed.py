"""Embeddings from the engine's own context, between its steps.

`Engine.embed` holds the step lock (the engine thread holds it for each step, so an embedding waits at
most one step and never runs beside one), turns llama.cpp's embeddings output on, decodes each input in
the spare sequence id `parallel` (no slot uses it: the loader asks for it, spare_seqs), reads the
result and removes that sequence's KV, then turns embeddings off again. A context that pools (an
embedding model's GGUF sets its pooling type) gives one vector per sequence, and the input must fit one
batch; otherwise (a generative model) the tokens' last hidden states are averaged, over as many batches
as the input needs. Vectors come back as llama.cpp computes them; normalising is the caller's choice.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from hypura.bindings.batch import Batch
from hypura.errors import HypuraError


def embed_one(llm, seq: int, tokens: list[int], n_batch: int) -> np.ndarray:
    ctx = llm.ctx
    pooled = llama_cpp.llama_pooling_type(ctx) not in (llama_cpp.LLAMA_POOLING_TYPE_NONE,
                                                       llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED)
    if pooled and len(tokens) > n_batch:
        raise HypuraError(f"an input of {len(tokens)} tokens is longer than a batch ({n_batch}) of this "
                          "embedding model: shorten it, or truncate")
    n_embd = llama_cpp.llama_model_n_embd(llm.model.model)
    total = np.zeros(n_embd, dtype=np.float64)
    batch = Batch(min(n_batch, len(tokens)))
    try:
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start:start + n_batch]
            c = batch.c
            for i, t in enumerate(chunk):
                c.token[i], c.pos[i], c.seq_id[i][0], c.logits[i] = t, start + i, seq, 1
            c.n_tokens = len(chunk)
            rc = llm.decode_batch(batch)
            if rc != 0:
                raise HypuraError(f"llama_decode returned {rc} for an embedding (the KV cache may be full: retry)")
            if pooled:
                total += np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_seq(ctx, seq), shape=(n_embd,))
            else:
                rows = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings(ctx), shape=(len(chunk), n_embd))
                total += rows.sum(axis=0, dtype=np.float64)
    finally:
        batch.close()
        llm.context.seq_rm(seq)
    return total if pooled else total / len(tokens)


def embed(llm, seq: int, inputs: list[list[int]], n_batch: int) -> list[np.ndarray]:
    ctx = llm.ctx
    llama_cpp.llama_set_embeddings(ctx, True)
    try:
        return [embed_one(llm, seq, tokens, n_batch) for tokens in inputs]
    finally:
        llama_cpp.llama_set_embeddings(ctx, False)
