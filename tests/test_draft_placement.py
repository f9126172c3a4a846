"""A speculative draft planned beside its target (hypura/plan/beside.py): its memory is kept within the
budgets or the free memory before the target is planned, on the GPU or in RAM by the pass time the plans
predict, and the draft loads where it was kept. Header-only models and a bundled profile: nothing measured."""

import dataclasses

import pytest

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan import parse_size
from hypura.plan.auto import Fit
from hypura.plan.beside import Beside
from hypura.plan.decision import Ask, Routing, decide
from hypura.profile import resolve_profile
from hypura.profile.free import FreeMemory

MiB, GiB = 1 << 20, 1 << 30
# a 1B-class draft: 700 MiB of weights read per token, a small KV cache
DRAFT = Beside("draft.gguf", weights=760 * MiB, kv_per_cell=32 << 10, buffer=300 * MiB, read_per_token=700 * MiB)


@pytest.fixture(scope="module")
def l8(tmp_path_factory):
    from hypura.synth import writer

    path = tmp_path_factory.mktemp("beside") / "l8.gguf"
    writer.write_synth("llama3.1-8b", path, sparse=True)  # header only: 4.6 GiB of weights, planned, not run
    return read_header(path)


def planned(header, ask: Ask, free=None):
    return decide(header, ask, free, resolve_profile("h200-design"), routing=Routing())


def test_a_draft_is_kept_within_the_budgets(l8):
    alone = planned(l8, Ask(gpu_mem="3GiB", ram="16GiB", n_ctx=4096))
    d = planned(l8, Ask(gpu_mem="3GiB", ram="16GiB", n_ctx=4096, beside=DRAFT))
    assert alone.beside_on_gpu is None and d.beside_on_gpu is True  # drafting from RAM would cost more
    gpu = d.plan.memory["gpu"]
    assert gpu["budget"] == parse_size("3GiB") - DRAFT.nbytes(4096)
    assert d.plan.used("gpu") <= gpu["budget"] and d.plan.memory["ram"]["budget"] == parse_size("16GiB")
    assert d.plan.bytes_by_tier()["gpu"] < alone.plan.bytes_by_tier()["gpu"]  # the target gave way


def test_a_draft_larger_than_the_gpu_budget_is_kept_in_ram(l8):
    big = dataclasses.replace(DRAFT, weights=3 * GiB)
    d = planned(l8, Ask(gpu_mem="3GiB", ram="16GiB", n_ctx=4096, beside=big))
    assert d.beside_on_gpu is False
    assert d.plan.memory["ram"]["budget"] == parse_size("16GiB") - big.nbytes(4096)
    assert d.plan.memory["gpu"]["budget"] == parse_size("3GiB")


def test_where_the_draft_goes_follows_the_predicted_pass(l8):
    # a draft whose bytes are seldom read (read_per_token tiny) drafts as fast from RAM: the GPU's bytes go to
    # the target, whose pass is then faster
    idle = dataclasses.replace(DRAFT, weights=1500 * MiB, read_per_token=1 * MiB)
    d = planned(l8, Ask(gpu_mem="3GiB", ram="16GiB", n_ctx=4096, beside=idle))
    on_gpu = planned(l8, Ask(gpu_mem=parse_size("3GiB") - idle.nbytes(4096), ram="16GiB", n_ctx=4096)).plan
    in_ram = planned(l8, Ask(gpu_mem="3GiB", ram=parse_size("16GiB") - idle.nbytes(4096), n_ctx=4096)).plan
    assert idle.pass_seconds(in_ram, False) < idle.pass_seconds(on_gpu, True)
    assert d.beside_on_gpu is False


def test_an_unset_context_keeps_the_draft_at_the_context_chosen(l8):
    d = planned(l8, Ask(gpu_mem="4GiB", ram="16GiB", fit=Fit(min_ctx=4096), beside=DRAFT))
    assert d.n_ctx >= 4096 and d.beside_on_gpu is not None and "draft draft.gguf" in d.line
    kept = DRAFT.nbytes(d.n_ctx)
    budget = d.plan.memory["gpu" if d.beside_on_gpu else "ram"]["budget"]
    assert budget == parse_size("4GiB" if d.beside_on_gpu else "16GiB") - kept


def test_a_draft_larger_than_every_budget_is_one_clear_error(l8):
    with pytest.raises(HypuraError, match="the draft draft.gguf needs .* of RAM at context 4096"):
        planned(l8, Ask(gpu_mem="1GiB", ram="6GiB", n_ctx=4096, beside=dataclasses.replace(DRAFT, weights=7 * GiB)))


def test_the_default_path_counts_the_draft_beside_a_model_that_fits(l8):
    def free(gpu: int) -> FreeMemory:
        return FreeMemory(gpu=gpu, ram=32 * GiB, gpu_total=80 * GiB, ram_total=64 * GiB, source="test")

    # room for the target resident with its draft on the GPU: llama.cpp's placement, the draft beside it
    roomy = planned(l8, Ask(n_ctx=4096, beside=DRAFT), free(12 * GiB))
    assert roomy.fits and roomy.plan is None and roomy.beside_on_gpu is True and "on the GPU, kept beside" in roomy.line
    # the target alone would fit, not with its draft: a plan, within the free memory less the draft
    resident = planned(l8, Ask(n_ctx=4096), free(7 * GiB))
    assert resident.fits
    tight = planned(l8, Ask(n_ctx=4096, beside=DRAFT), free(7 * GiB))
    assert not tight.fits and tight.plan is not None and tight.beside_on_gpu is not None
    where = "gpu" if tight.beside_on_gpu else "ram"
    assert tight.plan.memory[where]["budget"] == {"gpu": 6 * GiB, "ram": 30 * GiB}[where] - DRAFT.nbytes(4096)


def test_a_draft_model_loads_where_its_target_kept_it(smollm2_path, n_threads):
    from hypura import Llama

    llm = Llama(str(smollm2_path), ram="1GiB", n_ctx=512, n_threads=n_threads, verbose=False,
                draft_model=str(smollm2_path))
    try:
        draft = Beside.of(read_header(smollm2_path))
        assert llm.decision.beside_on_gpu is False  # no GPU here
        assert llm.plan.memory["ram"]["budget"] == parse_size("1GiB") - draft.nbytes(512)
        out = llm.create_completion("The capital of France is", max_tokens=8, temperature=0.0)
        assert out["choices"][0]["text"]
        drafter = llm.draft_model.drafter.model
        assert drafter.plan is None and drafter.decision.line == ""  # placed as kept: not fitted again
    finally:
        llm.close()
