"""Tree speculation: the cost model's choice of draft length and node budget (synthetic curves), the tree's
branches and acceptance rule (no model), and SmolLM2 drafting trees for itself through hypura.Llama:
greedy output identical to plain decoding, more than one drafted token accepted a pass, the KV cache
consistent after many tree passes, sampled output the same draws as plain decoding's."""

import numpy as np
import pytest

from hypura.speculative import DraftLength, DraftTree
from hypura.speculative.draft_length import PassTimes
from hypura.speculative.tree import Tree
from hypura.speculative.tree_draft import _select

from greedy import COUNTING, assert_same_text, greedy


# --- the cost model (synthetic curves) --------------------------------------------------------

def _run(length: DraftLength, accept: float, pass_s, passes: int = 40, seed: int = 0) -> list[int]:
    """Passes with per-token acceptance `accept` and pass cost pass_s(tokens carried): the chosen n's."""
    rng = np.random.default_rng(seed)
    chosen = []
    for _ in range(passes):
        n = length.choose(1000)
        chosen.append(n)
        hits = 0
        while hits < n and rng.random() < accept:
            hits += 1
        length.record(n, hits, pass_s(n + 1), 0.02 * n)  # drafting: 20 ms a token
    return chosen


@pytest.mark.parametrize("cost", ["flat", "streamed"])
def test_draft_length_follows_acceptance(cost):
    """Low acceptance: short drafts; high: long ones; and it moves when acceptance changes."""
    pass_s = {"flat": lambda n: 0.5, "streamed": lambda n: 0.5 + 0.01 * n}[cost]
    length = DraftLength(n_max=16)
    low = _run(length, 0.2, pass_s)
    high = _run(length, 0.97, pass_s, seed=1)
    again = _run(length, 0.2, pass_s, seed=2)
    assert np.mean(low[-10:]) <= 3, low
    assert np.mean(high[-10:]) >= 10, high
    assert np.mean(again[-10:]) <= 3, again


def test_draft_length_short_where_a_pass_costs_its_tokens():
    """Pass costs given beforehand (`hypura bench -p`): no exploration passes."""
    length = DraftLength(n_max=16, times=PassTimes.given({n: 0.01 * n for n in (1, 2, 4, 8, 16)}))
    chosen = _run(length, 0.6, lambda n: 0.01 * n)
    assert max(chosen) <= 2, chosen


def test_tree_budget_follows_acceptance():
    """A tree's node budget: large where candidates are often right and passes are flat, small where not."""
    def tree_run(length, rank_rates, passes=40, seed=0):
        rng = np.random.default_rng(seed)
        chosen = []
        for _ in range(passes):
            n = length.choose(1000)
            chosen.append(n)
            outcomes, depth = [], 1
            while depth <= min(n, 16):  # a reached node's candidates: at most one is the target's token
                hit = int(rng.choice(len(rank_rates) + 1, p=[*rank_rates, 1 - sum(rank_rates)]))
                outcomes += [(depth, r, r == hit + 1) for r in range(1, len(rank_rates) + 1)]
                if hit == len(rank_rates):
                    break
                depth += 1
            length.record(n, depth - 1, 0.5 + 0.002 * n, 0.01 * min(n, 16), outcomes, min(n, 16))
        return chosen

    length = DraftLength(n_max=64, width=4, depth_max=16)
    good = tree_run(length, [0.8, 0.1, 0.05, 0.02])
    poor = tree_run(length, [0.05, 0.02, 0.01, 0.01], seed=1)
    assert np.mean(good[-10:]) >= 20, good
    assert np.mean(poor[-10:]) <= 8, poor
    assert length.expected_tokens(8) < 1.3  # the truth: about 1.1


# --- the tree and its acceptance rule (no model) ------------------------------------------------

def _tree(spec):
    """spec: (token, parent, rank) for nodes 1..; node 0 is token 0."""
    t = Tree([0])
    for tok, parent, rank in spec:
        t.add(tok, parent, rank)
    return t


def test_seq_sets_put_the_top_chain_in_seq_0():
    #        0
    #      1   2        ranks 1, 2
    #     3 4   5       3 rank 1, 4 rank 2; 5 rank 1
    t = _tree([(11, 0, 1), (12, 0, 2), (13, 1, 1), (14, 1, 2), (15, 2, 1)])
    sets = t.seq_sets()
    assert sets[0] == [0, 1, 2] and sets[3] == [0]  # the root in every branch; 0 -> 1 -> 3 is seq 0
    assert sets[1] == [0, 1] and len(sets[2]) == 1 and sets[4] != sets[5]


def test_select_keeps_a_tree_within_budget_and_branches():
    # candidates: root 0; 1 (0.9), 2 (0.05) children of 0; 3 (0.8), 4 (0.08) of 1; 5 (0.7) of 3
    tok, parent = [0, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 1, 3]
    depth, rank, score = [0, 1, 1, 2, 2, 3], [0, 1, 2, 1, 2, 1], [1.0, 0.9, 0.05, 0.8, 0.08, 0.7]
    t = _select(tok, parent, depth, rank, score, n_nodes=4, branches=2)
    assert t.tokens == [0, 1, 3, 4, 5] and t.parent == [-1, 0, 1, 1, 2]
    t = _select(tok, parent, depth, rank, score, n_nodes=5, branches=1)  # one branch: a chain
    assert t.tokens == [0, 1, 3, 5]


def test_walk_keeps_the_targets_distribution():
    """A target over 3 tokens whose next-token law depends on the last token; trees of every shape.
    Walking a tree with samples drawn from each node's own context emits sequences distributed as
    sampling the target token by token (chi-square over the first three tokens)."""
    law = np.array([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.4, 0.5, 0.1]])  # P(next | last)
    rng = np.random.default_rng(0)
    trees = [_tree([]), _tree([(0, 0, 1), (1, 0, 2), (2, 1, 1), (0, 2, 1)]),
             _tree([(2, 0, 1), (1, 1, 1), (0, 2, 1)]), _tree([(1, 0, 1), (0, 0, 2), (2, 0, 3), (1, 2, 1)])]
    counts: dict = {}
    n = 6000
    for k in range(n):
        tree, seq = trees[k % len(trees)], []
        while len(seq) < 3:
            history = seq[-1] if seq else 0
            tree.tokens[0] = history

            def sample(i, tree=tree):  # the node's context: its own token is the last
                return int(rng.choice(3, p=law[tree.tokens[i]]))
            out, _, _ = tree.walk(sample, 3 - len(seq), lambda t: False)
            seq += out
        counts[tuple(seq)] = counts.get(tuple(seq), 0) + 1
    chi2 = 0.0
    for a in range(3):
        for b in range(3):
            for c in range(3):
                p = law[0, a] * law[a, b] * law[b, c]
                chi2 += (counts.get((a, b, c), 0) - n * p) ** 2 / (n * p)
    assert chi2 < 50.0, chi2  # 26 degrees of freedom: p ~ 0.003


# --- SmolLM2 drafting trees for itself through hypura.Llama --------------------------------------

def _llama(path, n_threads, **kw):
    from hypura import Llama

    return Llama(str(path), n_ctx=1024, n_threads=n_threads, n_threads_batch=n_threads, verbose=False, **kw)


def _complete(llm, prompt, n, **kw) -> str:
    return llm.create_completion(prompt, max_tokens=n, seed=1, **kw)["choices"][0]["text"]


@pytest.fixture(scope="module")
def pair(smollm2_path, n_threads):
    plain = _llama(smollm2_path, n_threads)
    tree = _llama(smollm2_path, n_threads, draft_model=DraftTree(str(smollm2_path), branches=4, n_max=8))
    yield plain, tree
    tree.close()
    plain.close()


def test_llama_tree_greedy_identical_and_kv_consistent(pair):
    """Greedy text is plain decoding's (up to a near-tie: tests/greedy.py); a second completion continuing the
    first reuses the KV cells the tree passes left (llama-cpp-python's prefix match) and is still plain
    decoding's."""
    import llama_cpp

    plain, tree = pair
    for llm in pair:
        llm.reset()
    prompt = plain.tokenize(COUNTING.encode(), add_bos=False)
    want = greedy(plain, prompt, 48)
    assert_same_text(_complete(tree, prompt, 48, temperature=0.0), want, at_least=24)
    spec = tree.stats(reset=True)["speculative"]
    assert spec["passes"] > 0 and spec["accepted_per_pass"] > 1.0, spec
    mem = llama_cpp.llama_get_memory(tree.ctx)
    assert llama_cpp.llama_memory_seq_pos_max(mem, 0) + 1 >= tree.n_tokens - 1
    assert all(llama_cpp.llama_memory_seq_pos_max(mem, s) == -1 for s in range(1, 4))  # no branch left
    more = prompt + list(want.tokens)  # the count goes on from where the tree's completion left it
    again = greedy(plain, more, 16)
    assert_same_text(_complete(tree, more, 16, temperature=0.0), again, at_least=8)
    assert tree.stats()["speculative"]["passes"] > 0


@pytest.mark.slow
def test_llama_tree_sampled_distribution_kept(pair):
    """The second and third sampled tokens at temperature 1 (taken from a tree pass's path or its
    correction) are distributed as plain decoding's: the chi-square permutation test of
    test_speculative, over disjoint seeds. (The same seed does not give the same text, with a chain
    or a tree: a pass's logits differ from single-token decoding's in the last bits, and over the
    whole vocabulary that moves some draws across a boundary.)"""
    from test_speculative import _pairs, _permutation_p

    plain, tree = pair
    ids = plain.tokenize(b"The capital of France is")
    n = 300
    a = _pairs(plain, ids, range(n))
    tree.stats(reset=True)
    b = _pairs(tree, ids, range(10_000, 10_000 + n))
    spec = tree.stats()["speculative"]
    assert 0.05 < spec["acceptance"] < 0.95, spec  # both sides of the rule were taken
    assert len(set(a)) >= 3, a
    assert _permutation_p(a, b) > 0.01
