"""The context each served sequence gets: -c when given, else 4096 held to the model's training context over
the sequences, so that the one KV cache they share, which llama.cpp takes for one sequence's context
(n_ctx_seq: the warning `n_ctx_seq (16384) > n_ctx_train (8192)`, the RoPE factors it chooses), stays within
what the model was trained on unless the user asks for more."""

from __future__ import annotations

import llama_cpp
import pytest

from hypura.modelfile import read_header
from hypura.serve.settings import ServeSettings


class _Header:
    def __init__(self, n_train):
        self.n_train = n_train

    def get(self, key, default=None):
        return self.n_train if key == "context_length" and self.n_train is not None else default


@pytest.mark.parametrize("n_ctx, parallel, n_train, want", [
    (None, 4, 8192, 2048),  # SmolLM2 at -np 4: the training context over four sequences
    (None, 1, 8192, 4096),
    (None, 1, 2048, 2048),  # a model trained on less than 4096
    (None, 4, 131072, 4096),
    (None, 1024, 8192, 16),  # the floor: a prompt and a reply of a few tokens
    (None, 4, None, 4096),  # no training context in the file
    (16384, 4, 8192, 16384),  # asked for: given, past the training context too
])
def test_the_context_per_sequence(n_ctx, parallel, n_train, want):
    assert ServeSettings(n_ctx=n_ctx, parallel=parallel).ctx_per_seq(_Header(n_train)) == want


def test_the_served_smollm2_stays_within_its_training_context(smollm2_path):
    from hypura.serve.server import start_engine

    llm, engine = start_engine(smollm2_path, ServeSettings(parallel=4, llama_kwargs={"n_threads": 1}))
    try:
        n_train = int(read_header(smollm2_path).get("context_length"))
        assert n_train == 8192 and llama_cpp.llama_n_ctx_seq(llm.ctx) <= n_train
        assert engine.n_ctx_per_seq == n_train // 4
    finally:
        engine.close()
        llm.close()
