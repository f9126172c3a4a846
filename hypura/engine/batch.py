"""A step written into the engine's llama_batch (hypura.bindings.batch): each token with its position and its
sequence's id (the slot), and an output flag only where a token is sampled (or a drafted one verified); after
the decode, the greedy sequences' tokens read from its logits at once."""

from __future__ import annotations

from hypura.bindings.batch import Batch
from hypura.engine.sampler import greedy_rows
from hypura.engine.step import Step


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


def greedy_picks(ctx, n_vocab: int, step: Step, first: list[int]) -> dict[int, int]:
    """The tokens of the step's plain greedy sequences, by batch index, from one argmax over the logits matrix
    (sampler.greedy_rows); the other sequences sample with their llama.cpp chain."""
    rows, indices, n_out = [], [], 0
    for chunk, start in zip(step.chunks, first):
        for k in chunk.outputs:
            if chunk.seq.sampler.greedy:
                rows.append(n_out)
                indices.append(start + k)
            n_out += 1
    if not rows:
        return {}
    return dict(zip(indices, greedy_rows(ctx, n_vocab, n_out, rows)))
