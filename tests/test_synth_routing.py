"""Routing-aware synthetic MoE models: the router knobs change what llama.cpp's routers select, as
measured by a routing trace of a real forward pass."""

import numpy as np
import pytest

import hypura
from hypura.errors import HypuraError
from hypura.modelfile import read_header
from routing_trace import RoutingTrace
from hypura.synth.routing import (
    CALIBRATION_TOLERANCE,
    RouterRows,
    Routing,
    calibrate_scales,
    selection_frequencies,
    target_frequencies,
)
from hypura.synth.writer import write_synth

N_TOKENS = 480  # tiny-qwen3moe: 16 experts, 4 used; ~2 % noise on a frequency


@pytest.mark.parametrize("n_expert,k,skew", [(8, 2, 1.0), (16, 4, 1.2), (128, 8, 0.5)])
def test_row_scales_give_the_target_frequencies(n_expert, k, skew):
    rng = np.random.default_rng(0)
    target = target_frequencies(n_expert, k, skew)
    assert target.sum() == pytest.approx(k) and np.all(np.diff(target) <= 1e-12)
    scales = calibrate_scales(target, k, rng)
    got = selection_frequencies(rng.standard_normal((50_000, n_expert)) * scales, k)
    assert np.abs(got - target).max() < CALIBRATION_TOLERANCE


def test_a_skew_scales_cannot_give_is_refused():
    with pytest.raises(HypuraError, match="try a smaller skew"):
        RouterRows(Routing(skew=1.0), 128, 8, 0.02, np.random.default_rng(0))
    with pytest.raises(HypuraError, match="router-layer-corr"):
        Routing(layer_corr=1.5)


def _trace(path, n_threads):
    h = read_header(path)
    trace = RoutingTrace(int(h.get("expert_count")), int(h.get("expert_used_count")))
    llm = hypura.Llama(str(path), n_ctx=1024, n_batch=512, logits_all=True,  # every token through the last layer
                       n_threads=n_threads, verbose=False, on_route=trace.record)
    try:
        llm.eval([int(t) for t in np.random.default_rng(0).integers(0, llm.n_vocab(), N_TOKENS)])
    finally:
        llm.close()
    return trace


def _top_quarter_share(freq: np.ndarray) -> float:
    top = np.sort(freq)[::-1][: len(freq) // 4]
    return float(top.sum() / freq.sum())


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = {}
    knobs = {"uniform": Routing(), "skewed": Routing(skew=2.0), "correlated": Routing(layer_corr=0.9),
             "quiet blocks": Routing(out_scale=0.002)}
    for name, routing in knobs.items():
        path = tmp_path_factory.mktemp("routing") / f"{name}.gguf"
        write_synth("tiny-qwen3moe", path, routing=routing)
        out[name] = path
    return out


def test_skew_concentrates_the_selections(traces, n_threads):
    uniform, skewed = _trace(traces["uniform"], n_threads), _trace(traces["skewed"], n_threads)
    assert len(uniform.selections(0)) == N_TOKENS
    # layer 0: what the embeddings reach directly (deeper layers add the synthetic forward pass's own
    # skew, see hypura/synth/routing.py). Over seeds 0-2: 0.30-0.40 uniform (the prompt repeats tokens),
    # 0.45-0.53 with skew 2, and skew 2 at least 0.11 above uniform at each seed
    share, skewed_share = _top_quarter_share(uniform.frequencies(0)), _top_quarter_share(skewed.frequencies(0))
    assert share < 0.42 and skewed_share > share + 0.08, (share, skewed_share)


def test_layer_correlation_repeats_experts(traces, n_threads):
    assert _trace(traces["uniform"], n_threads).overlap(0) < 0.35  # chance: k / n_expert = 0.25
    assert _trace(traces["correlated"], n_threads).overlap(0) > 0.55  # measured 0.71


def test_routing_knobs_are_recorded(traces):
    h = read_header(traces["skewed"])
    assert h.metadata["hypura.synth.router_skew"] == pytest.approx(2.0)
    assert h.metadata["hypura.synth.router_layer_corr"] == 0.0


def test_the_router_hook_sees_every_token_and_changes_nothing(traces, n_threads, smollm2_path):
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 4000, 64)]
    trace = RoutingTrace(16, 4)
    logits = []
    for hook in (None, trace.record):
        llm = hypura.Llama(str(traces["skewed"]), n_ctx=256, logits_all=True, n_threads=n_threads, verbose=False,
                           on_route=hook)
        try:
            llm.eval(tokens)
            logits.append(np.array(llm.scores[: len(tokens)], copy=True))
        finally:
            llm.close()
    assert np.array_equal(*logits)
    for layer in (0, 1):
        sel = trace.selections(layer)
        assert sel.shape == (len(tokens), 4) and sel.min() >= 0 and sel.max() < 16
        assert all(len(set(row)) == 4 for row in sel)  # top-k picks distinct experts
    with pytest.raises(HypuraError, match="no MoE router"):
        hypura.Llama(str(smollm2_path), verbose=False, on_route=trace.record)


def test_quiet_block_outputs_keep_routing_uniform_at_every_layer(traces, n_threads):
    """With the blocks' outputs scaled down, each layer's router sees its token's embedding, not the
    context averages attention adds: skew 0 is uniform at the last layer too (default: ~0.40 there)."""
    trace = _trace(traces["quiet blocks"], n_threads)
    assert all(_top_quarter_share(trace.frequencies(layer)) < 0.36 for layer in (0, 1))  # measured 0.31, 0.30
    assert read_header(traces["quiet blocks"]).get("hypura.synth.block_out_scale") == pytest.approx(0.002)
