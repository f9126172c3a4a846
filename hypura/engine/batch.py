"""A step written into the engine's llama_batch (hypura.bindings.batch): each token with its position and its
sequence's id (the slot), and an output flag only where a token is sampled (or a drafted one verified)."""

from __future__ import annotations

from hypura.bindings.batch import Batch
from hypura.engine.scheduler import Step


def fill(batch: Batch, step: Step) -> list[int]:
    """Write `step` into the batch; returns, per chunk, the batch index of its first token."""
    b, i, first = batch.c, 0, []
    assert step.n_tokens <= batch.capacity
    token, pos, seq_id, logits = b.token, b.pos, b.seq_id, b.logits
    for chunk in step.chunks:
        slot, tokens = chunk.seq.slot, chunk.tokens
        first.append(i)
        if len(tokens) == 1:  # a decoding sequence's next token
            token[i], pos[i], logits[i] = tokens[0], chunk.pos, chunk.sample
            seq_id[i][0] = slot
            i += 1
            continue
        p = chunk.pos
        for t in tokens:
            token[i] = t
            pos[i] = p
            seq_id[i][0] = slot
            logits[i] = 0
            i += 1
            p += 1
        for k in chunk.outputs:
            logits[first[-1] + k] = 1
    b.n_tokens = i
    return first
