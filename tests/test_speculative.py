"""Speculative decoding: drafters, the draft-length cost model, one-pass verification through
hypura.Llama (llama-cpp-python's generate loop) and the Verifier; greedy output identical to plain
decoding, sampled output distributed as plain decoding's, a foreign vocabulary refused."""

import numpy as np
import pytest
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

from hypura.errors import HypuraError
from hypura.speculative import DraftLength, NgramSimple, PromptLookup

from greedy import COUNTING, assert_same_text, greedy


# --- drafters and the cost model (no model) ----------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_prompt_lookup_drafts_as_llama_cpp_python(seed):
    rng = np.random.default_rng(seed)
    history = rng.integers(0, 6, size=int(rng.integers(2, 60))).astype(np.intc)
    want = LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=7)(history)
    assert PromptLookup(3, 7).draft(history.tolist(), 7) == want.tolist()


def test_ngram_simple_copies_what_followed_the_newest_match():
    history = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert NgramSimple(size_n=3, size_m=4).draft(history, 10) == [7, 8, 5, 1]
    assert NgramSimple(size_n=3, size_m=4).draft(history, 2) == [7, 8]
    assert NgramSimple(size_n=4, size_m=4).draft(history, 10) == []  # 9 1 2 3 / 5 1 2 3 differ


def test_draft_length_follows_acceptance_and_cost():
    flat = DraftLength(n_max=16)
    for _ in range(30):  # every draft accepted, a pass costs the same whatever it carries
        flat.record(4, 4, 0.1, 0.0)
    assert flat.choose(100) == 16
    assert flat.choose(5) == 5  # never more than the caller allows
    costly = DraftLength(n_max=16)
    for k in range(1, 9):  # a pass costs its tokens (a CPU doing the work), one in three accepted
        costly.record(k, 0, 0.01 * (k + 1), 0.0)
        costly.record(k, 1 if k > 1 else 0, 0.01 * (k + 1), 0.0)
    assert costly.choose(100) == 1


# --- hypura.Llama(draft_model=...) -----------------------------------------------------------

def _llama(path, n_threads, **kw):
    from hypura import Llama

    return Llama(str(path), n_ctx=1024, n_threads=n_threads, n_threads_batch=n_threads, verbose=False, **kw)


def _greedy(llm, prompt, n=64) -> str:
    llm.reset()
    return llm.create_completion(prompt, max_tokens=n, temperature=0.0, seed=1)["choices"][0]["text"]


@pytest.fixture(scope="module")
def plain(smollm2_path, n_threads):
    llm = _llama(smollm2_path, n_threads)
    yield llm
    llm.close()


@pytest.mark.parametrize("draft", ["prompt_lookup", "ngram", "self"])
def test_llama_greedy_identical_with_speculation(plain, smollm2_path, n_threads, draft):
    drafter = {"prompt_lookup": lambda: LlamaPromptLookupDecoding(num_pred_tokens=10),
               "ngram": lambda: NgramSimple(size_n=2, size_m=16), "self": lambda: str(smollm2_path)}[draft]()
    llm = _llama(smollm2_path, n_threads, draft_model=drafter)
    prompt = plain.tokenize(COUNTING.encode(), add_bos=False)
    try:
        assert_same_text(_greedy(llm, prompt), greedy(plain, prompt, 64), at_least=24)  # tests/greedy.py
        spec = llm.stats()["speculative"]
        assert spec["passes"] > 0 and spec["tokens_per_pass"] > 1.0, spec
        if draft == "self":  # a model drafting for itself is always right
            assert spec["acceptance"] > 0.9, spec
    finally:
        llm.close()


def test_foreign_vocabulary_refused(smollm2_path, gemma_path, n_threads):
    with pytest.raises(HypuraError, match="does not share the target's vocabulary"):
        _llama(smollm2_path, n_threads, draft_model=str(gemma_path))


class _FixedDraft(LlamaDraftModel):
    """Always drafts the same tokens: some positions accepted, some rejected, at temperature 1."""

    def __init__(self, tokens):
        self.tokens = np.asarray(tokens, dtype=np.intc)

    def __call__(self, input_ids, /, **kwargs):
        return self.tokens


def _pairs(llm, ids, seeds) -> list[tuple[int, int]]:
    """(second, third) sampled tokens after the prompt, at temperature 1, one run per seed."""
    out = []
    for seed in seeds:
        llm.set_seed(seed)
        gen = llm.generate(ids, temp=1.0, top_k=0, top_p=1.0, min_p=0.0, reset=True)
        next(gen)
        out.append((next(gen), next(gen)))
        gen.close()
    return out


def test_sampled_distribution_kept(plain, smollm2_path, n_threads):
    """The second and third sampled tokens (the third comes from the pass's logits where the draft
    was accepted, from the next pass where it was not) are distributed as plain decoding's: a
    chi-square test over disjoint seeds."""
    ids = plain.tokenize(b"The capital of France is")
    plain.reset()
    gen = plain.generate(ids, top_k=1, temp=0.0, reset=True)
    greedy = [next(gen) for _ in range(4)]
    gen.close()
    llm = _llama(smollm2_path, n_threads, draft_model=_FixedDraft(greedy[1:4]))
    try:
        n = 300
        a = _pairs(plain, ids, range(n))
        b = _pairs(llm, ids, range(10_000, 10_000 + n))
        accepted = np.mean([second == greedy[1] for second, _ in b])
        assert 0.05 < accepted < 0.95, accepted  # both sides of the rule were taken
    finally:
        llm.close()
    assert len(set(a)) >= 3, a
    assert _permutation_p(a, b) > 0.01


def _chi2(labels: np.ndarray, cats: np.ndarray, n_a: int) -> float:
    table = np.stack([np.bincount(cats[labels], minlength=cats.max() + 1),
                      np.bincount(cats[~labels], minlength=cats.max() + 1)])
    table = table[:, table.sum(axis=0) > 0]
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum())


def _permutation_p(a: list, b: list, rounds: int = 2000) -> float:
    """Two-sample test of equal distributions: the chi-square statistic against its values under
    shuffled labels (no scipy needed, no large-sample approximation)."""
    index = {c: i for i, c in enumerate(sorted(set(a) | set(b)))}
    cats = np.array([index[c] for c in a + b])
    labels = np.arange(len(cats)) < len(a)
    seen = _chi2(labels, cats, len(a))
    rng = np.random.default_rng(0)
    hits = sum(_chi2(rng.permutation(labels), cats, len(a)) >= seen for _ in range(rounds))
    return (hits + 1) / (rounds + 1)
