"""Speculative decoding in the batched engine: several sequences' drafts (n-gram lookup, a draft model drafting
for all of them at once) verified in one step.

What equals what: each sequence's greedy tokens, from an engine with speculation and from the same engine
without it (four sequences batched in both; SmolLM2-135M, one thread, flash attention), are one-token
decoding's up to its first near-tie (tests/greedy.py: llama.cpp's kernels are not batch-invariant, and a
near-tie is the CPU's to decide): counts and a repeated alphabet, decided for long and copied from the prompt.
Sampled output: the same seed gives the same tokens (the target's own samples are emitted, one random draw each,
in order). The draft length is pinned (n_min = n_max): the cost model's choice follows measured step times, and
with it the batch shapes."""

import llama_cpp
import pytest

from hypura.engine import EngineConfig, SamplingParams
from hypura.engine.batch import fill
from hypura.engine.step import plan_step
from hypura.engine.speculate import share
from hypura.errors import HypuraError
from hypura.speculative import SpecSettings

from greedy import assert_same_tokens, greedy

COUNT = "Count: " + ", ".join(map(str, range(1, 21)))
# continuations SmolLM2 keeps decided (tests/greedy.py) for 48 tokens, the alphabet's for 25; most copied from the
# prompt, so that n-gram drafts are right
PROMPTS = [f"{COUNT}\n{COUNT[:16]}", "1, 2, 3, 4, 5,", "Alphabet: a b c d e f g h i j k l m n o p q r s t u v w x y z\n"
           "Alphabet: a b c", "2, 4, 6, 8, 10,"]
N_GEN = 48
ONE_THREAD = {"n_threads": 1, "n_threads_batch": 1}


# --- the step's shape (no model) -----------------------------------------------------------------

class _Seq:
    def __init__(self, prompt, n_past, next_token=None, slot=0):
        self.prompt, self.n_past, self.next_token, self.slot = prompt, n_past, next_token, slot
        self.feed = prompt
        self.prefilling = n_past < len(prompt)


def test_drafts_share_the_room_short_ones_whole():
    assert share([2, 10, 10], 12) == [2, 5, 5]
    assert share([3, 3], 100) == [3, 3]
    assert share([8, 8, 8], 0) == [0, 0, 0]
    assert sum(share([7, 1, 9, 4], 13)) == 13


def test_a_draft_rides_after_its_next_token_with_logits_at_every_position():
    from hypura.bindings.batch import Batch

    a, b, p = _Seq([1, 2], 2, next_token=7, slot=0), _Seq([3], 1, next_token=8, slot=1), _Seq([4] * 20, 0, slot=2)
    step = plan_step([a, b, p], budget=10, drafts={a: [5, 6, 9]})
    assert [(c.tokens, c.pos, c.draft) for c in step.chunks[:2]] == [([7, 5, 6, 9], 2, (5, 6, 9)), ([8], 1, ())]
    assert len(step.chunks[2].tokens) == 5 and step.n_tokens == 10  # the prompt takes what the drafts leave
    batch = Batch(10)
    try:
        first = fill(batch, step)
        c = batch.c
        assert first == [0, 4, 5]
        assert [c.logits[i] for i in range(10)] == [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
        assert [c.pos[i] for i in range(5)] == [2, 3, 4, 5, 1] and [c.seq_id[i][0] for i in range(5)] == [0] * 4 + [1]
    finally:
        batch.close()


# --- the engine on SmolLM2 -----------------------------------------------------------------------

def _run(path, speculative, params, prompts=PROMPTS, parallel=4):
    from hypura.engine import load

    llm, engine = load(path, parallel, 512, config=EngineConfig(speculative=speculative), **ONE_THREAD)
    try:
        with engine._inbox.lock:  # the engine thread takes them all off the queue at once: all in the first step
            requests = [engine.submit(engine.tokenize(p), params) for p in prompts]
        results = [r.result(timeout=300) for r in requests]
        metrics = engine.metrics()
        mem = llama_cpp.llama_get_memory(llm.ctx)
        # every slot's KV holds exactly the tokens the engine thinks it does: rejected drafts' cells are gone
        slots = engine._scheduler.slots
        kv = [(llama_cpp.llama_memory_seq_pos_max(mem, s), len(slots.kv[s]) - 1) for s in range(parallel)]
        return results, metrics, kv
    finally:
        engine.close()
        llm.close()


GREEDY = SamplingParams(max_tokens=N_GEN, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def plain(smollm2_path):
    return _run(smollm2_path, None, GREEDY)


@pytest.fixture(scope="module")
def one_token(smollm2_path):
    """Each prompt's greedy continuation, one token a decode, with its near-ties (tests/greedy.py)."""
    from hypura import Llama

    llm = Llama(str(smollm2_path), n_ctx=512, flash_attn=True, verbose=False, **ONE_THREAD)
    try:
        return [greedy(llm, llm.tokenize(p.encode()), N_GEN) for p in PROMPTS]
    finally:
        llm.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ngram-simple", "prompt-lookup"])
def test_greedy_tokens_equal_with_and_without_speculation(smollm2_path, plain, one_token, kind):
    spec = SpecSettings(type=kind, ngram_size_n=3, n_min=8, n_max=8)
    results, metrics, kv = _run(smollm2_path, spec, GREEDY)
    for want, alone, got in zip(one_token, plain[0], results):
        assert_same_tokens(alone.tokens, want, at_least=20)
        assert_same_tokens(got.tokens, want, at_least=20)
        assert got.finish_reason == alone.finish_reason == "length"
    assert all(pos == n for pos, n in kv), kv
    s = metrics["speculative"]
    assert s["passes"] > 0 and 0 < s["steps"] <= s["passes"] and s["accepted_tokens"] <= s["drafted_tokens"]
    assert s["acceptance"] == pytest.approx(s["accepted_tokens"] / s["drafted_tokens"])
    assert s["tokens_per_pass"] == pytest.approx(s["accepted_per_pass"] + 1)
    assert s["accepted_per_pass"] > 1.0, s  # the copy-heavy prompts: most of a pass's draft is right
    # the same tokens, never in more steps (the sequence with the fewest accepted drafts sets the count)
    assert metrics["generated_tokens"] == plain[1]["generated_tokens"]
    assert metrics["decode"]["steps"] <= plain[1]["decode"]["steps"]
    assert "speculative" not in plain[1]  # off: the engine's metrics as before


@pytest.mark.slow
def test_sampled_tokens_equal_with_the_same_seed(smollm2_path):
    params = SamplingParams(max_tokens=32, temperature=0.7, top_k=40, seed=7)
    want, _, _ = _run(smollm2_path, None, params, PROMPTS[:2], parallel=2)
    got, metrics, _ = _run(smollm2_path, SpecSettings(type="prompt-lookup", n_min=4, n_max=4), params,
                           PROMPTS[:2], parallel=2)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert metrics["speculative"]["accepted_tokens"] > 0


def test_a_sequence_ends_inside_a_pass(smollm2_path, one_token):
    """max_tokens reached and a stop string met mid-draft: the result stops there, the KV stays consistent."""
    spec = SpecSettings(type="prompt-lookup", n_min=8, n_max=8)
    prompt = [PROMPTS[0]]
    full, _, _ = _run(smollm2_path, None, SamplingParams(max_tokens=24, temperature=0), prompt, parallel=1)
    assert_same_tokens(full[0].tokens, one_token[0].first(24), at_least=20)
    for n in (5, 11):
        got, metrics, kv = _run(smollm2_path, spec, SamplingParams(max_tokens=n, temperature=0), prompt, parallel=1)
        assert_same_tokens(got[0].tokens, one_token[0].first(n), at_least=n)
        assert got[0].finish_reason == "length" and kv[0][0] == kv[0][1]
    stop = full[0].text[12:16]
    got, _, _ = _run(smollm2_path, spec, SamplingParams(max_tokens=24, temperature=0, stop=(stop,)), prompt, 1)
    assert got[0].text == full[0].text[:full[0].text.index(stop)] and got[0].finish_reason == "stop"


@pytest.mark.slow
def test_a_draft_model_drafts_for_every_sequence_at_once(smollm2_path, one_token):
    """SmolLM2 drafting for itself: its drafts are the target's own greedy tokens (up to the kernels)."""
    spec = SpecSettings(type="draft-simple", draft_model=smollm2_path, n_min=4, n_max=4)
    results, metrics, kv = _run(smollm2_path, spec, GREEDY)
    for want, got in zip(one_token, results):
        assert_same_tokens(got.tokens, want, at_least=20)
    assert all(pos == n for pos, n in kv), kv
    s = metrics["speculative"]
    assert s["acceptance"] > 0.9 and s["accepted_per_pass"] > 3, s
    assert s["passes"] > s["steps"]  # several sequences' drafts verified in one step


def test_a_draft_model_of_another_vocabulary_is_refused(smollm2_path, gemma_path):
    from hypura.engine import load

    spec = SpecSettings(type="draft-simple", draft_model=gemma_path)
    with pytest.raises(HypuraError, match="does not share the target's vocabulary"):
        load(smollm2_path, 2, 256, config=EngineConfig(speculative=spec), **ONE_THREAD)
