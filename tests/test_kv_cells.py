"""The cells of `hypura serve -kvu`'s unified KV cache, chosen by the planner (hypura/plan/kv_cells.py): on a 24 GB
GPU profile, where cells on the GPU displace weights; on a CPU host, what RAM holds beside the weights; where
llama.cpp's placement fits, every sequence's. Synthetic headers, bundled or pinned profiles, a stated free
memory: nothing measured. `hypura inspect -np N --kv-unified` says the choice."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from hypura.cli.inspect_cmd import inspect
from hypura.modelfile import read_header
from hypura.plan.auto import CTX_DECODE_TOLERANCE
from hypura.plan.decision import Ask, decide
from hypura.plan.kv_cells import candidates, rate_at, score
from hypura.profile import resolve_profile
from hypura.profile.free import FreeMemory
from hypura.synth import writer
from hypura.tiers.names import GPU, RAM
from conftest import PINNED_PROFILE

GiB = 1 << 30
PARALLEL, PER_SEQ = 8, 4096
ASKED = PARALLEL * PER_SEQ


@pytest.fixture(scope="module")
def header(tmp_path_factory):
    """Llama 3.3 70B's layers, 12 of them (7.1 GiB of weights; 48 KiB of KV a cell)."""
    path = tmp_path_factory.mktemp("kv_cells") / "llama3.3-70b-12.gguf"
    writer.write_synth("llama3.3-70b", path, layers=12, ftype="q4_k_m", sparse=True)
    return read_header(path)


def free(ram_gib: float) -> FreeMemory:
    return FreeMemory(gpu=None, ram=int(ram_gib * GiB), gpu_total=None, ram_total=64 * GiB, source="test")


def test_on_a_24gb_gpu_the_cells_that_pay_displace_weights_and_no_more(header):
    profile = resolve_profile("24gb-gpu-64gb")
    ask = Ask(plan="auto", gpu_mem="4GiB", n_ctx=ASKED, parallel=PARALLEL)
    # the oracle: each candidate decided on its own, as without -kvu, and scored
    plans = {c: decide(header, dataclasses.replace(ask, n_ctx=c), None, profile).plan
             for c in candidates(ASKED, PARALLEL)}
    assert list(plans) == [4096, 8192, 16384, 32768]
    scores = {c: score(p, c, PER_SEQ, PARALLEL) for c, p in plans.items()}
    d = decide(header, dataclasses.replace(ask, kv_cells=True), None, profile)
    cells = d.cells
    best = min(scores.values())
    assert cells.cells == max(c for c, s in scores.items() if s <= best * (1 + CTX_DECODE_TOLERANCE))
    assert PER_SEQ < cells.cells < ASKED  # more cells than one sequence's pay, every sequence's cost too much
    assert d.n_ctx == d.plan.n_ctx == cells.cells and d.plan.kv_tier == cells.tier == GPU
    # the cache on the GPU took room the fewest cells' plan gave weights
    gpu_weights = {c: p.bytes_by_tier()[GPU] for c, p in plans.items()}
    assert cells.gpu_weights == gpu_weights[cells.cells] < gpu_weights[PER_SEQ]
    assert cells.weights_given == gpu_weights[PER_SEQ] - gpu_weights[cells.cells] > 0
    assert cells.kv_bytes == d.plan.kv_bytes == header_kv(header, cells.cells)
    assert cells.held == cells.cells // PER_SEQ and cells.one_tok_s == rate_at(d.plan, 1)
    said = cells.describe()
    assert f"KV cells {cells.cells} of {ASKED} (-np {PARALLEL} x -c {PER_SEQ})" in said and "on the GPU" in said
    assert "of weights on the GPU" in said and "KV cells" not in d.line  # the decision's own line stays its own


def header_kv(header, cells: int) -> int:
    from hypura.units import model_units

    dims = model_units(header).dims
    return dims.kv_bytes_per_layer(cells) * dims.n_layer


def test_without_kv_cells_the_decision_is_as_before(header):
    profile = resolve_profile("24gb-gpu-64gb")
    ask = Ask(plan="auto", gpu_mem="4GiB", n_ctx=ASKED, parallel=PARALLEL)
    d = decide(header, ask, None, profile)
    assert d.cells is None and d.n_ctx == ASKED and "KV cells" not in d.line


@pytest.mark.parametrize("ram_gib, want", [(10, 8192), (11, 16384), (12, ASKED)])
def test_on_a_cpu_host_the_cells_are_what_ram_holds_beside_the_weights(header, ram_gib, want):
    """The pinned profile has no GPU: the most cells with every weight still in RAM (llama.cpp's placement fits
    them, or the plan keeps the fewest cells' tiers), never more than -np x -c."""
    profile = resolve_profile(str(PINNED_PROFILE))
    ask = Ask(n_ctx=ASKED, parallel=PARALLEL, n_gpu_layers=0)
    fits = {c: decide(header, dataclasses.replace(ask, n_ctx=c), free(ram_gib), profile).fits
            for c in candidates(ASKED, PARALLEL)}
    assert fits[want] and all(not f for c, f in fits.items() if c > want)  # the oracle: llama.cpp's fit check
    d = decide(header, dataclasses.replace(ask, kv_cells=True), free(ram_gib), profile)
    assert d.n_ctx == d.cells.cells == want and d.cells.tier == RAM and d.fits and d.plan is None
    assert d.cells.kv_bytes == header_kv(header, want) and "of weights on the GPU" not in d.cells.describe()
    assert d.line.startswith(f"hypura: fits: llama.cpp's placement (in RAM), context {want}")


def test_where_ram_holds_no_more_the_fewest_cells_keep_the_weights_off_disk(header):
    """A RAM where even -c cells push weights to disk: more cells would push more; the fewest are taken."""
    profile = resolve_profile(str(PINNED_PROFILE))
    ask = Ask(n_ctx=ASKED, parallel=PARALLEL, n_gpu_layers=0)
    d = decide(header, dataclasses.replace(ask, kv_cells=True), free(9), profile)
    assert d.n_ctx == PER_SEQ and d.plan is not None and d.plan.bytes_by_tier()["disk"] > 0
    assert d.cells.cells == PER_SEQ and d.cells.tier == RAM


def test_one_sequence_or_a_given_plan_take_the_cells_asked(header):
    profile = resolve_profile("24gb-gpu-64gb")
    one = decide(header, Ask(plan="auto", gpu_mem="4GiB", n_ctx=PER_SEQ, parallel=1, kv_cells=True), None, profile)
    assert one.n_ctx == one.cells.cells == PER_SEQ
    plan = decide(header, Ask(plan="auto", gpu_mem="4GiB", n_ctx=ASKED, parallel=PARALLEL), None, profile).plan
    given = decide(header, Ask(plan=plan, parallel=PARALLEL, n_ctx=ASKED, kv_cells=True), None, profile)
    assert given.plan is plan and given.n_ctx == ASKED and "the placement was given" in given.cells.describe()


def test_rate_at_reads_the_plans_own_predictions(tmp_path):
    path = tmp_path / "llama3.3-70b.gguf"  # all 80 layers: on 24 GB, a plan that streams, with its step table
    writer.write_synth("llama3.3-70b", path, ftype="q4_k_m", sparse=True)
    ask = Ask(plan="auto", n_ctx=ASKED, parallel=PARALLEL)
    plan = decide(read_header(path), ask, None, resolve_profile("24gb-gpu-64gb")).plan
    assert rate_at(plan, PARALLEL) == plan.prediction.decode_tok_s and rate_at(plan, 1) == plan.one_decode_tok_s
    table = {k: r for k, _, r in plan.step_paths}
    assert rate_at(plan, 4) == table[4]
    # without a step table: a step's time between one's and all's, so the aggregate rises with the sequences
    resident = dataclasses.replace(plan, step_paths=())
    rates = [rate_at(resident, k) for k in range(1, PARALLEL + 1)]
    assert rates == sorted(rates) and rates[0] == plan.one_decode_tok_s and rates[-1] == plan.prediction.decode_tok_s


def test_inspect_says_the_cells_where_they_live_and_their_cost(header):
    r = CliRunner().invoke(inspect, [str(header.path), "-np", str(PARALLEL), "--kv-unified", "--profile",
                                     "24gb-gpu-64gb", "--gpu-mem", "4GiB"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("cells "))
    assert f"of {ASKED} (-np {PARALLEL} x -c {PER_SEQ})" in line and "on the GPU" in line
    assert "of weights on the GPU" in line and "for one alone" in line
    cells = int(line.split()[3])
    assert f"context  {cells} tokens" in r.output  # the plan shown is the one at those cells
    # -c is each sequence's context, as serve's
    r = CliRunner().invoke(inspect, [str(header.path), "-np", "2", "-c", "1024", "--kv-unified", "--profile",
                                     "24gb-gpu-64gb", "--gpu-mem", "4GiB"])
    assert r.exit_code == 0, r.output
    assert "of 2048 (-np 2 x -c 1024)" in r.output


def test_the_servers_start_line_says_the_cells(smollm2_path, n_threads, caplog):
    """`hypura serve -kvu` on this (pinned, GPU-less) machine: SmolLM2 fits, so every sequence's cells, in RAM."""
    pytest.importorskip("uvicorn")
    from hypura.serve.server import start_engine
    from hypura.serve.settings import ServeSettings

    settings = ServeSettings(parallel=2, n_ctx=128, kv_unified=True,
                             llama_kwargs={"n_threads": n_threads, "n_threads_batch": n_threads})
    with caplog.at_level("INFO", logger="hypura.serve"):
        llm, engine = start_engine(smollm2_path, settings)
    try:
        assert llm.decision.cells.cells == llm.context.n_ctx() == 256 and engine.n_ctx_per_seq == 256
    finally:
        engine.close()
        llm.close()
    lines = [r.getMessage() for r in caplog.records if "--kv-unified" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert ("--kv-unified: KV cells 256 of 256 (-np 2 x -c 128)" in lines[0] and "in RAM" in lines[0]
            and "llama.cpp's placement fits them" in lines[0] and "llama.cpp holds 256 cells" in lines[0])
