"""Speculation without asking (hypura/speculative/auto_draft.py): a draft found in the stores by its vocabulary,
kept only where the cost model predicts a gain; n-gram drafting by default only where the plan streams weights; the
flags that ask for it or turn it off; and a served model with a draft found for it replies as without one.

The store holds SmolLM2-135M's synthetic draft (`hypura synth --draft-for`: its vocabulary, one layer, 35 % of
its bytes) and a tiny synthetic model with another vocabulary. Pass costs are fakes where the choice is tested;
the loads use SmolLM2 under a RAM budget that streams it from disk."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from hypura.speculative import auto_draft
from hypura.modelfile import read_header
from hypura.plan.auto import Fit
from hypura.plan.beside import Beside
from hypura.speculative.settings import SpecSettings
from hypura.store import Catalog

from test_engine_speculative import one_token  # noqa: E402,F401  (a fixture used here)

SHARE = 0.5  # the synthetic draft is 35 % of SmolLM2's bytes (its embeddings and head are the target's)
RAM = "280MiB"  # SmolLM2 streamed from disk under it (the pinned profile's plan), with the draft beside too
SERVE_RAM = "360MiB"  # the same for the server's 4 sequences of 512 tokens


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path) -> Path:
    from hypura.synth import write_synth
    from hypura.synth.draft import write_draft

    root = tmp_path_factory.mktemp("store")
    write_draft(smollm2_path, root / "smol-draft.gguf", agreement=0.8, layers=1)
    write_synth("tiny-llama", root / "other-vocab.gguf")  # its own synthetic vocabulary
    return root


@pytest.fixture
def only(store, tmp_path, monkeypatch):
    """A store of `names` (files of `store`) and no Ollama or LM Studio store."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))

    def make(*names) -> Path:
        folder = tmp_path / "models"
        folder.mkdir()
        for n in names:
            os.symlink(store / n, folder / n)
        monkeypatch.setenv("HYPURA_MODELS", str(folder))
        return folder
    return make


# --- the search (headers only) ---------------------------------------------------------------------

def test_candidates_by_vocabulary_and_size(smollm2_path, only):
    catalog = Catalog.scan(only("smol-draft.gguf", "other-vocab.gguf"))
    assert [m.path.name for m in auto_draft.candidates(smollm2_path, catalog, max_share=SHARE)] == ["smol-draft.gguf"]
    assert auto_draft.candidates(smollm2_path, catalog) == []  # above a quarter of the target's bytes
    # the target itself, in the store, is no draft for itself
    assert auto_draft.candidates(smollm2_path, [SimpleNamespace(path=smollm2_path, size=0)], max_share=2.0) == []


def test_header_vocab_check_is_the_loads(smollm2_path, store):
    from hypura.modelfile import read_vocab
    from hypura.speculative.vocab_match import from_file, mismatch

    want = from_file(read_vocab(smollm2_path))
    assert mismatch(want, from_file(read_vocab(store / "smol-draft.gguf"))) is None
    assert "tokens, the target 49152" in mismatch(want, from_file(read_vocab(store / "other-vocab.gguf")))


# --- keep or drop: fake pass costs -----------------------------------------------------------------

def _plan(mode="mixed", pass_s=lambda n: 1.0):
    return SimpleNamespace(mode=mode, step_seconds=pass_s, rates=SimpleNamespace(gpu_read=0.0, cpu_read=20e9))


def _find(monkeypatch, smollm2_path, store, plain_pass, spec_pass, mode="mixed"):
    """find_draft over the store's draft, each decision a fake: the target's ask with nothing, then the candidate,
    beside, decided on the machine's sources as given."""
    from hypura.plan import decision

    ask, asked = decision.Ask.of(gpu_mem="1GiB", draft_beside="auto"), []

    def decide(header, candidate, free, profile, routing, devices):
        assert candidate == dataclasses.replace(ask, beside=candidate.beside)
        assert (free, profile, routing, devices) == ("free", "profile", "routing", "devices")
        if candidate.beside is None:
            return SimpleNamespace(plan=_plan(mode, plain_pass))
        asked.append(candidate.beside.name)
        return SimpleNamespace(plan=_plan(mode, spec_pass), beside_on_gpu=False)
    monkeypatch.setattr(decision, "decide", decide)
    machine = SimpleNamespace(free="free", profile="profile", routing="routing", devices="devices")
    models = [SimpleNamespace(name="smol-draft", path=store / "smol-draft.gguf", size=0)]
    plain, found = auto_draft.find_draft(read_header(smollm2_path), ask, machine, models=models)
    assert plain.plan.step_seconds is plain_pass
    return found, asked


def test_kept_where_a_pass_costs_the_same_whatever_it_carries(smollm2_path, store, monkeypatch):
    monkeypatch.setattr(auto_draft, "MAX_SHARE", SHARE)
    found, asked = _find(monkeypatch, smollm2_path, store, lambda n: 1.0, lambda n: 1.0 + 0.001 * n)
    assert asked == ["smol-draft.gguf"] and found.name == "smol-draft"
    # long drafts at agreement 0.6 yield up to 1 / (1 - 0.6) = 2.5 tokens a pass; each drafted token reads 32 MB
    assert found.length >= 8 and 2.0 < found.gain < 2.5
    assert "smol-draft" in found.line() and "in RAM" in found.line() and f"{found.gain:.2f}x" in found.line()


def test_dropped_where_a_pass_costs_its_tokens(smollm2_path, store, monkeypatch):
    monkeypatch.setattr(auto_draft, "MAX_SHARE", SHARE)
    found, asked = _find(monkeypatch, smollm2_path, store, lambda n: 0.05 * n, lambda n: 0.05 * n)
    assert asked == ["smol-draft.gguf"] and found is None
    # the draft's memory costing the target's plan more than speculation gains: dropped too
    found, _ = _find(monkeypatch, smollm2_path, store, lambda n: 1.0, lambda n: 3.0)
    assert found is None


def test_no_search_for_a_resident_model(smollm2_path, store, monkeypatch):
    found, asked = _find(monkeypatch, smollm2_path, store, lambda n: 1.0, lambda n: 1.0, mode="full-resident")
    assert found is None and asked == []


def test_ngram_on_by_default_only_for_a_streamed_plan():
    flat, steep = (lambda n: 1.0 + 0.01 * n), (lambda n: 0.05 * n)
    assert auto_draft.ngram_pays(_plan("dense-ffn-streaming", flat))
    assert not auto_draft.ngram_pays(_plan("dense-ffn-streaming", steep))
    assert not auto_draft.ngram_pays(_plan("full-resident", flat)) and not auto_draft.ngram_pays(None)
    s = SpecSettings(type="auto")
    assert auto_draft.resolve(s, SimpleNamespace(plan=_plan("mixed", flat), draft_found=None)).type == "ngram-simple"
    assert auto_draft.resolve(s, SimpleNamespace(plan=_plan("full-resident", flat), draft_found=None)) is None
    found = auto_draft.resolve(dataclasses.replace(s, draft_model=auto_draft.AutoDraft()),
                         SimpleNamespace(plan=_plan("full-resident", flat), draft_found=Path("d.gguf")))
    assert found.type == "draft-simple" and found.draft_model == Path("d.gguf")
    explicit = SpecSettings(type="prompt-lookup")
    assert auto_draft.resolve(explicit, SimpleNamespace(plan=None)) is explicit


# --- the flags ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, want", [
    ({}, ("auto", None)),  # hypura-cli's default: n-gram drafting where the plan makes it pay
    ({"spec_type": "none"}, None),
    ({"spec_draft_model": "auto"}, ("auto", auto_draft.AutoDraft())),
    ({"spec_type": "ngram-simple"}, ("ngram-simple", None)),
])
def test_cli_flags(flags, want):
    from hypura.cli.completion.speculative import spec_settings

    kw = dict.fromkeys(("spec_draft_model", "spec_type", "spec_draft_n_max", "spec_draft_n_min", "spec_ngram_n",
                        "spec_ngram_m", "spec_tree", "spec_draft_p_min", "spec_draft_p_split", "spec_pass_ms")) | flags
    s = spec_settings(kw, SpecSettings(type="auto"))
    assert (s if s is None else (s.type, s.draft_model)) == want


# --- loads -----------------------------------------------------------------------------------------

def _kept(monkeypatch):
    """A draft found is kept and loads: the keep-or-drop choice is the fakes' above (here the draft's memory would
    cost the streamed target more than speculation gains, and it would be dropped). The planner's compute-buffer
    floor (256 MiB) for the draft too would leave SmolLM2 no room to stream under a budget it also needs to stream:
    the draft's buffer counted at its real size."""
    monkeypatch.setattr(auto_draft, "MAX_SHARE", SHARE)
    monkeypatch.setattr(auto_draft, "MIN_GAIN", 0.0)
    of = Beside.of
    monkeypatch.setattr(Beside, "of", classmethod(lambda cls, *a, **k: dataclasses.replace(of(*a, **k),
                                                                                          buffer=8 << 20)))


@pytest.mark.slow
def test_llama_auto_draft_found_used_and_said_once(smollm2_path, only, monkeypatch):
    from hypura import Llama

    _kept(monkeypatch)
    only("smol-draft.gguf", "other-vocab.gguf")
    lines = []
    kw = dict(ram=RAM, n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False, fit=Fit(say=lines.append))
    llm = Llama(str(smollm2_path), draft_model="auto", **kw)
    try:
        assert llm.draft_found is not None and llm.draft_found.name == "smol-draft.gguf"
        assert llm.plan.mode != "full-resident" and llm.decision.beside_on_gpu is False
        said = [line for line in lines if "smol-draft" in line]
        assert len(said) == 1 and "predicted" in said[0]
        got = llm.create_completion("1, 2, 3, 4, 5,", max_tokens=24, temperature=0)["choices"][0]["text"]
        assert llm.stats()["speculative"]["passes"] > 0
    finally:
        llm.close()
    plain = Llama(str(smollm2_path), **kw)
    try:
        assert plain.create_completion("1, 2, 3, 4, 5,", max_tokens=24, temperature=0)["choices"][0]["text"] == got
    finally:
        plain.close()


@pytest.mark.slow
def test_none_found_is_silent(smollm2_path, only, monkeypatch):
    from hypura import Llama

    only("other-vocab.gguf")
    lines = []
    llm = Llama(str(smollm2_path), draft_model="auto", ram=RAM, n_ctx=256, n_threads=1, verbose=False,
                fit=Fit(say=lines.append))
    try:
        assert llm.draft_found is None and llm.draft_model is None and not any("draft" in x for x in lines)
    finally:
        llm.close()


@pytest.mark.slow
def test_served_with_an_automatic_draft_replies_as_without(smollm2_path, only, monkeypatch, one_token):
    """The server's default (an AutoDraft: a draft from the stores, where the plan streams) with the draft length
    pinned: its greedy replies (tests/test_serve_speculative.py's prompts) are one-token decoding's up to its first
    near-tie (tests/greedy.py), as the server's without speculation are, and /metrics says the draft was used."""
    pytest.importorskip("openai")
    from greedy import assert_same_text
    from serve_helpers import engine_of, real_server, wait_idle
    from test_serve_speculative import _replies

    _kept(monkeypatch)
    folder = only("smol-draft.gguf", "other-vocab.gguf")
    spec = SpecSettings(type="auto", draft_model=auto_draft.AutoDraft(folder), n_min=8, n_max=8)
    server = real_server(smollm2_path, prefix_cache=False, ram=SERVE_RAM, speculative=spec)
    try:
        engine = engine_of(server)
        assert engine.config.speculative.type == "draft-simple"
        assert engine.config.speculative.draft_model.name == "smol-draft.gguf"
        for got, want in zip(_replies(server), one_token):
            assert_same_text(got, want, at_least=20)
        assert wait_idle(engine)["speculative"]["passes"] > 0
    finally:
        server.stop()


# --- the engine steps aside as the batch grows (fake step costs) -------------------------------------

class _Decoding:
    def __init__(self, slot: int):
        self.slot, self.next_token, self.tokens_left = slot, 7, 64
        self.prompt, self.generated = [1, 2, 3, 7] * 8, []  # an n-gram drafter finds the repeat


def _engine_spec(step_s, n_min=0):
    from hypura.engine.speculate import Speculation
    from hypura.speculative.draft_length import PassTimes

    s = Speculation(SpecSettings(type="ngram-simple", ngram_size_n=2, n_min=n_min), SimpleNamespace(plan=None),
                    max_tokens=512)
    s.steps = PassTimes.given({n: step_s(n) for n in (1, 4, 16, 64, 128, 256)})
    return s


@pytest.mark.parametrize("step_s, n_seq, aside", [
    (lambda n: 1.0 + 0.001 * n, 16, False),  # streamed weights: drafts ride along for free
    (lambda n: 0.01 * n, 16, True),  # a step costs its tokens: 16 clients fill it already
    (lambda n: 0.01 * n, 1, False),  # one client always speculates (its draft length is its own choice)
])
def test_engine_drafts_only_where_the_step_pays(step_s, n_seq, aside):
    spec = _engine_spec(step_s)
    seqs = [_Decoding(i) for i in range(n_seq)]
    drafts, _ = spec.drafts(seqs)
    assert spec.aside is aside and (drafts == {}) is aside
    if not aside:
        assert all(drafts[s] for s in seqs)


def test_pinned_draft_length_never_steps_aside():
    spec = _engine_spec(lambda n: 0.01 * n, n_min=4)
    drafts, _ = spec.drafts([_Decoding(i) for i in range(16)])
    assert not spec.aside and all(len(d) >= 4 for d in drafts.values())
