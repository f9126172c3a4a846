"""llama.cpp's n_outputs_max, which a micro-batch the decision grows sets to the logits rows its caller reads
(plan/microbatch.py outputs_needed): what each front end declares, the batch that asks more refused before
llama.cpp (which aborts on one), and greedy output unchanged by the larger micro-batch."""

from __future__ import annotations

import importlib

import pytest

from hypura import Llama
from hypura.engine import engine_llama_kwargs
from hypura.errors import HypuraError

loading = importlib.import_module("hypura.loaded.load")  # the module: hypura.loaded.load names its function

from greedy import COUNTING, assert_same_tokens, greedy


class _Asked(Exception):
    pass


@pytest.fixture
def asked(monkeypatch):
    """The Ask each hypura.Llama hands the decision (the load stops there)."""
    seen = []

    def decide(header, ask, *args, **kwargs):
        seen.append(ask)
        raise _Asked

    monkeypatch.setattr(loading, "decide", decide)
    return seen


def _outputs(asked, path, **kwargs) -> int:
    with pytest.raises(_Asked):
        Llama(str(path), **{"gpu_mem": "1GiB", "ram": "2GiB", "verbose": False, **kwargs})
    return asked[-1].n_outputs


def test_each_front_end_declares_the_rows_it_reads(asked, smollm2_path):
    assert _outputs(asked, smollm2_path) == 1  # hypura.Llama, hypura-cli: the last token's logits
    assert _outputs(asked, smollm2_path, logits_all=True) == 0  # every row
    assert _outputs(asked, smollm2_path, **engine_llama_kwargs(4, 64)) == 5  # the engine: n_seq_max
    spec = engine_llama_kwargs(4, 64, speculative=True)
    assert spec["param_overrides"]["context_params"]["n_outputs_max"] == 0
    assert _outputs(asked, smollm2_path, **spec) == 0  # a verified draft: every row


def test_the_cli_reads_a_verification_pass_of_rows(monkeypatch):
    """hypura-cli's passes carry up to the longest draft (--spec-draft-n-max, 16) and one more token."""
    from hypura.cli.completion import arg, common_init

    seen = {}

    def fake_load(path, ask):
        seen.update(ask.param_overrides["context_params"])
        raise _Asked

    monkeypatch.setattr(common_init, "load", fake_load)
    cases = ((["--spec-type", "ngram-simple", "--spec-draft-n-max", "4"], 5), (["--spec-type", "ngram-simple"], 17))
    for argv, want in cases:
        seen.clear()
        with pytest.raises(_Asked):
            common_init.load_model(arg.parse(["-m", "x.gguf", "-p", "hi"] + argv), "x.gguf")
        assert seen.get("n_outputs_max") == want


def test_a_batch_asking_more_outputs_is_refused_before_llama_cpp(smollm2_path):
    """llama.cpp aborts the process on such a batch (output_reserve); Hypura raises."""
    llm = Llama(str(smollm2_path), n_ctx=256, logits_all=True, verbose=False,
                param_overrides={"context_params": {"n_outputs_max": 2}})
    try:
        with pytest.raises(HypuraError, match="n_outputs_max"):
            llm.eval(llm.tokenize(b"Once upon a time, there"))
        llm.reset()
        llm.eval(llm.tokenize(b"Once"))  # within it: decodes
    finally:
        llm.close()


def test_greedy_output_unchanged_by_a_larger_micro_batch_with_one_output(smollm2_path):
    """A prompt longer than a small micro-batch, in one micro-batch as large as the prompt that computes logits
    for its last row alone, continues as in the small ones (up to the first near-tie; llama.cpp's 512 against
    1024 is the same change, at a cost this machine's tests keep small)."""
    made = {}
    for ub, ctx in ((8, {}), (64, {"n_outputs_max": 1})):
        llm = Llama(str(smollm2_path), n_ctx=256, n_batch=64, n_ubatch=ub, verbose=False,
                    param_overrides={"context_params": ctx})
        try:
            prompt = llm.tokenize(COUNTING.encode())
            assert 8 < len(prompt) <= 64
            made[ub] = greedy(llm, prompt, 24)
        finally:
            llm.close()
    assert made[64].tokens and len(made[64].tokens) == len(made[8].tokens)
    assert_same_tokens(made[64].tokens, made[8], at_least=16)


def test_an_engine_verifying_drafts_needs_their_outputs(smollm2_path):
    from hypura.engine import Engine, EngineConfig
    from hypura.speculative.settings import SpecSettings

    llm = Llama(str(smollm2_path), **engine_llama_kwargs(2, 64, param_overrides={"context_params": {"n_outputs_max": 3}}))
    try:
        with pytest.raises(HypuraError, match="speculative=True"):
            Engine(llm.loaded, EngineConfig(parallel=2, speculative=SpecSettings(type="ngram-simple")))
    finally:
        llm.close()
