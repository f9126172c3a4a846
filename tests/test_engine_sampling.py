"""The batched engine's sampling on SmolLM2-135M: stop strings, seeds, penalties, the batched argmax, grammars,
logprobs and embeddings, each sequence with its own sampler in a shared step."""

import llama_cpp
import pytest

from hypura.engine import SamplingParams
from hypura.errors import HypuraError

from engine_helpers import PARALLEL, N_CTX, GREEDY, PROMPT, running, engine_llm
from greedy import COUNTING, assert_same_text, assert_same_tokens, greedy


@pytest.fixture(scope="module")
def llm(smollm2_path, n_threads):
    yield from engine_llm(smollm2_path, n_threads)


def test_stop_strings_end_before_them_and_are_never_sent(llm):
    with running(llm) as engine:
        tokens = engine.tokenize(PROMPT)
        full = engine.submit(tokens, SamplingParams(max_tokens=24, temperature=0.0)).result(60)
        stop = full.text[12:17]  # spans tokens, well inside the text
        events = []
        r = engine.submit(tokens, SamplingParams(max_tokens=24, temperature=0.0, stop=("NEVER", stop)),
                          on_event=events.append).result(60)
    assert r.finish_reason == "stop" and r.text == full.text[: full.text.index(stop)]
    assert "".join(e.text for e in events) == r.text and r.completion_tokens < 24
    assert all(stop not in e.text for e in events) and events[-1].finish_reason == "stop"


def test_seeds_reproduce_samples_alone_and_in_a_batch(llm):
    tokens = llm.tokenize(PROMPT.encode())
    def warm(seed):
        return SamplingParams(max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)

    with running(llm) as engine:
        alone = engine.submit(tokens, warm(3)).result(60)
        batch = [engine.submit(tokens, warm(s)) for s in (3, 4, 3)]
        r3, r4, r3b = [r.result(60) for r in batch]
    assert alone.tokens == r3.tokens == r3b.tokens  # each sequence has its own sampler
    assert r4.tokens != r3.tokens


def test_penalties_see_the_prompt(llm):
    tokens = llm.tokenize(b"1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3,")
    with running(llm) as engine:
        plain = engine.submit(tokens, SamplingParams(max_tokens=6, temperature=0.0)).result(60)
        penalized = engine.submit(tokens, SamplingParams(max_tokens=6, temperature=0.0, repeat_penalty=5.0)).result(60)
    assert plain.text.startswith(" 1, 2,")
    assert penalized.tokens[0] != plain.tokens[0]  # the first sample already avoids the prompt's tokens


def test_the_batched_argmax_picks_what_llama_cpps_greedy_sampler_picks(llm):
    """Plain greedy sequences take their token from one argmax over the step's logits: the first maximum,
    as llama.cpp's greedy scan; ties, infinities and NaN included (a NaN maximum goes to llama.cpp)."""
    import numpy as np

    from hypura.engine.sampler import Sampler, greedy_rows

    ctx, n = llm.ctx, 8
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    batch = llama_cpp.llama_batch_init(2 * n, 0, 1)
    try:
        for i in range(2 * n):  # every other token has logits: output row k is batch index 2k + 1
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = 100 + i, i // 4, 1
            batch.seq_id[i][0], batch.logits[i] = i % PARALLEL, i % 2
        batch.n_tokens = 2 * n
        assert llama_cpp.llama_decode(ctx, batch) == 0
        m = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(n, n_vocab))
        m[1, :] = 0.0  # all equal: the first
        m[2, [7, 300, n_vocab - 1]] = 1e9  # a three-way tie
        m[3, :] = -np.inf
        m[3, 5] = np.inf
        m[3, 9] = np.inf
        m[4, 0], m[4, 1:] = -0.0, 0.0  # -0.0 == 0.0: a tie, the first
        m[5, 0] = np.nan  # llama.cpp keeps index 0 when it is NaN
        m[6, 3] = np.nan  # and never picks a NaN after it
        samplers = [Sampler(GREEDY, n_vocab, N_CTX) for _ in range(n)]
        want = [s.sample(ctx, 2 * k + 1) for k, s in enumerate(samplers)]
        got = greedy_rows(ctx, n_vocab, n, list(range(n)))
        assert [g if g >= 0 else s.sample(ctx, 2 * k + 1) for k, (g, s) in enumerate(zip(got, samplers))] == want
        assert got[5] == got[6] == -1 and want[1] == 0 and want[2] == 7 and want[3] == 5 and want[4] == 0
        assert greedy_rows(ctx, n_vocab, n, [0, 2, 7]) == [want[0], want[2], want[7]]
        for s in samplers:
            s.close()
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)


@pytest.mark.slow
def test_greedy_and_sampled_sequences_share_a_step_each_with_its_own_sampler(llm):
    """A step's plain greedy rows go through one argmax, the others through their llama.cpp chains. A step of four
    prompts and one of one run other kernels (tests/greedy.py; four prompts' 120 rows take flash attention's tiled
    path), so the greedy rows are held to one-token decoding up to its first near-tie, on a prompt decided for all
    16 tokens, and a seeded row to its own draws in a step of the same shape."""
    tokens = llm.tokenize(COUNTING.encode())
    want = greedy(llm, tokens, GREEDY.max_tokens)
    warm = SamplingParams(max_tokens=16, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)
    penalized = SamplingParams(max_tokens=16, temperature=0.0, repeat_penalty=1.3)
    kinds = (GREEDY, warm, penalized, GREEDY)
    with running(llm, prefix_cache=False) as engine:
        alone = [engine.submit(tokens, p).result(60).tokens for p in kinds]
        together = [r.result(60).tokens for r in [engine.submit(tokens, p) for p in kinds]]
        assert engine.submit(tokens, warm).result(60).tokens == alone[1]  # the seed's draws again
    for got in (alone[0], alone[3], together[0], together[3]):
        assert_same_tokens(got, want, at_least=16)
    for row in (alone, together):  # sampling and the penalty apply to their own rows only
        assert row[1] != row[0] and row[2] != row[0]


def test_a_grammar_constrains_its_sequence_only_even_greedy_and_penalized(llm):
    tokens = llm.tokenize(COUNTING.encode())
    want = greedy(llm, tokens, 8)
    yes_no = 'root ::= ("yes" | "no") " " [0-9] [0-9]'
    with running(llm) as engine:
        plain = engine.submit(tokens, SamplingParams(max_tokens=8, temperature=0.0))
        constrained = engine.submit(tokens, SamplingParams(max_tokens=8, temperature=0.0, grammar=yes_no))
        penalized = engine.submit(tokens, SamplingParams(max_tokens=8, temperature=1.0, repeat_penalty=1.3,
                                                         grammar=yes_no))  # the prompt is not fed to the grammar
        results = [r.result(60) for r in (plain, constrained, penalized)]
        with pytest.raises(HypuraError, match="grammar"):
            engine.submit(tokens, SamplingParams(grammar="root ::= ("))
        assert engine.submit(tokens, SamplingParams(max_tokens=2)).result(60).finish_reason == "length"
    # the greedy fast path beside a grammar's sequences: one-token decoding's text up to its first near-tie (a step
    # of three rows runs other kernels than one of one: tests/greedy.py)
    assert_same_text(results[0].text, want, at_least=8)
    for r in results[1:]:
        assert r.finish_reason == "stop" and r.text.split(" ")[0] in ("yes", "no") and r.text[-2:].isdigit()
    with pytest.raises(HypuraError, match="grammar"):
        SamplingParams(grammar=yes_no, ignore_eos=True)


def test_json_strings_admit_no_control_characters(llm):
    """The schema grammars' string character (llama.cpp's): after an opening quote, a newline is masked."""
    import ctypes

    from hypura.engine.sampler import grammar_sampler
    from hypura.serve.generate.grammars import ANY_OBJECT, schema_rules

    assert r'[^"\\\x7F\x00-\x1F]' in schema_rules(ANY_OBJECT, "format")
    (quote,), (newline,), (letter,) = (llm.tokenize(t, add_bos=False) for t in (b'"', b"\n", b"a"))
    sampler = grammar_sampler(llm._model.vocab, schema_rules({"type": "string"}, "format"))
    try:
        llama_cpp.llama_sampler_accept(sampler, quote)
        data = (llama_cpp.llama_token_data * 2)(llama_cpp.llama_token_data(newline, 1.0, 0.0),
                                                llama_cpp.llama_token_data(letter, 1.0, 0.0))
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(llama_cpp.llama_token_data_array(data, 2, -1, False)))
    finally:
        llama_cpp.llama_sampler_free(sampler)
    assert data[0].logit == float("-inf") and data[1].logit == 1.0


def test_logprobs_are_the_models_and_embeddings_use_the_spare_sequence(llm):
    import numpy as np

    tokens = llm.tokenize(PROMPT.encode())
    with running(llm) as engine:
        request = engine.submit(tokens, SamplingParams(max_tokens=4, temperature=0.0, logprobs=2))
        events = [e for e in request.events(60) if e.token is not None]
        vectors = engine.embed([tokens, tokens[:3], tokens])
        assert engine.submit(tokens, SamplingParams(max_tokens=2)).result(60).finish_reason == "length"
    for e in events:
        (best, best_lp), (_, second_lp) = e.logprob.top
        assert best == e.token and e.logprob.logprob == pytest.approx(best_lp) and second_lp <= best_lp <= 0
    assert vectors[0].shape == (llama_cpp.llama_model_n_embd(llm.model),) and np.allclose(vectors[0], vectors[2])
    assert not np.allclose(vectors[0], vectors[1])
