"""The default path (hypura/plan/auto.py): with no placement given, a model that fits the free memory
runs as llama.cpp places it, one that does not is planned within it; explicit placement keeps its
meaning; bad input is one line. Free memory is limited through the injectable probe
($HYPURA_FREE_MEMORY, or Fit.free)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hypura
from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan.auto import Fit
from hypura.plan.budget import check_budgets
from hypura.plan.decision import Ask, decide as decide_for
from hypura.profile.free import FreeMemory, cgroup_limit, parse_override
from greedy import COUNTING, assert_same_text, greedy

MiB, GiB = 1 << 20, 1 << 30
HYPURA_CLI = [sys.executable, "-m", "hypura.cli.completion"]
# SmolLM2-135M (92 MiB of weights): resident at context 4096 it needs ~438 MiB as llama.cpp holds it
TIGHT = 2450 * MiB  # less the 2 GiB margin: 402 MiB, so weights stream from disk
ABOVE_THE_FREE = 2100 * MiB  # 52 MiB less the margin, not even the compute buffer: llama.cpp's placement fits it whole
TOO_LITTLE = 200 * MiB  # under llama.cpp's placement (~438 MiB at 4096) and the planner's floor (359 MiB) alike


def free(ram: int) -> FreeMemory:
    return FreeMemory(gpu=None, ram=ram, gpu_total=None, ram_total=8 * GiB, source="test")


def quiet(**kw) -> Fit:
    return Fit(free=kw.pop("free"), measure_profile=False, **kw)


def decide(header, ask: Ask, fit: Fit, say=None):
    """The one decision (hypura/plan/decision.py) on the default path, its line said as hypura.Llama says it."""
    from dataclasses import replace

    from hypura.profile.measure import planning_profile

    d = decide_for(header, replace(ask, fit=fit), fit.free, lambda: planning_profile(measure=False))
    if say is not None:
        say(d.line)
    return d


# --- the probe ------------------------------------------------------------------------------------

def test_cgroup_v2_and_v1_limits_are_read(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "a" / "b").mkdir(parents=True)
    (v2 / "a" / "memory.max").write_text("4294967296\n")
    (v2 / "a" / "memory.current").write_text(str(1 * GiB))
    (v2 / "a" / "b" / "memory.max").write_text("max\n")
    (v2 / "a" / "b" / "memory.current").write_text(str(GiB))
    (v2 / "a" / "memory.stat").write_text(f"anon 1\ninactive_file {GiB // 2}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/a/b\n")
    assert cgroup_limit(v2, proc) == (4 * GiB, 3 * GiB + GiB // 2)  # the parent's limit binds
    v1 = tmp_path / "v1"
    (v1 / "memory" / "x").mkdir(parents=True)
    (v1 / "memory" / "x" / "memory.limit_in_bytes").write_text(str(2 * GiB))
    (v1 / "memory" / "x" / "memory.usage_in_bytes").write_text(str(GiB))
    proc.write_text("5:memory:/x\n1:cpu:/\n")
    assert cgroup_limit(v1, proc) == (2 * GiB, GiB)
    proc.write_text("0::/\n")
    assert cgroup_limit(tmp_path / "none", proc) is None


def test_override_replaces_what_it_names():
    measured = FreeMemory(gpu=None, ram=20 * GiB, gpu_total=None, ram_total=24 * GiB)
    got = parse_override("ram=6GiB", measured)
    assert (got.ram, got.gpu, got.ram_total) == (6 * GiB, None, 24 * GiB)
    with pytest.raises(HypuraError, match="expected e.g."):
        parse_override("vram=1GiB", measured)
    with pytest.raises(HypuraError, match="no GPU"):
        parse_override("gpu=8GiB", measured)


# --- the decision ---------------------------------------------------------------------------------

def test_a_model_that_fits_is_left_to_llama_cpp_at_its_training_context(smollm2_path):
    d = decide(read_header(smollm2_path), Ask(), quiet(free=free(16 * GiB)), say=None)
    assert d.plan is None and d.n_ctx == 8192
    assert d.line.startswith("hypura: fits: llama.cpp's placement (in RAM), context 8192")


def test_an_unset_context_shrinks_before_anything_is_planned(smollm2_path):
    # at 8192 it needs ~528 MiB, at 4096 ~438 MiB: llama.cpp's --fit cuts the context first, so do we
    d = decide(read_header(smollm2_path), Ask(), quiet(free=free(2 * GiB + 460 * MiB)), say=None)
    assert d.plan is None and d.n_ctx == 4096 and "training context 8192 does not fit" in d.line


def test_a_model_that_does_not_fit_is_planned_within_the_free_memory(smollm2_path):
    lines = []
    d = decide(read_header(smollm2_path), Ask(), quiet(free=free(TIGHT)), say=lines.append)
    plan = d.plan
    assert plan is not None and lines == [d.line]
    assert plan.used("ram") <= TIGHT - 2 * GiB and plan.bytes_by_tier()["disk"] > 0
    assert d.n_ctx == plan.n_ctx == 4096  # the minimum: more context would only take weights' RAM
    for part in ("hypura: plan: weights ram", "disk", "context 4096", "predicts decode", "limited by disk",
                 "why: needs"):
        assert part in d.line


def test_min_ctx_is_fitc(smollm2_path):
    # below 4096 it fits again: at 2048 (the halving before -fitc 1024), llama.cpp's placement
    d = decide(read_header(smollm2_path), Ask(), quiet(free=free(TIGHT), min_ctx=1024), say=None)
    assert d.plan is None and d.n_ctx == 2048


def test_an_explicit_context_is_honoured_and_the_line_says_which_would_avoid_disk(smollm2_path):
    d = decide(read_header(smollm2_path), Ask(n_ctx=8192), quiet(free=free(2 * GiB + 480 * MiB)), say=None)
    assert d.plan is not None and d.plan.n_ctx == 8192 and d.plan.bytes_by_tier()["disk"] > 0
    assert "-c 8192: its KV cache (180.0 MiB) puts" in d.line and "-c 4096 would keep every weight off disk" in d.line


def test_bad_input_is_one_line_saying_what_is_needed_and_what_there_is(smollm2_path):
    header = read_header(smollm2_path)
    with pytest.raises(HypuraError, match=r"not enough free memory .* needs .* this machine has RAM 200\.0 MiB .* "
                                          r"less a 2\.0 GiB margin"):
        decide(header, Ask(), quiet(free=free(TOO_LITTLE)), say=None)
    with pytest.raises(HypuraError, match=r"-c 100000000: its KV cache \(.*\) does not fit .* largest context"):
        decide(header, Ask(n_ctx=100_000_000), quiet(free=free(TIGHT)), say=None)
    with pytest.raises(HypuraError, match=r"--ram 64GiB is more than this machine has: 8\.0 GiB"):
        check_budgets(None, "64GiB", free(TIGHT))
    with pytest.raises(HypuraError, match="sees no GPU"):
        check_budgets("1GiB", None, free(TIGHT))


def test_a_model_that_fits_only_in_the_margin_is_held_as_llama_cpp_holds_it_not_refused(smollm2_path):
    """The margin is the default path's preference: where it leaves nothing, the free RAM itself is used, said."""
    header = read_header(smollm2_path)
    d = decide(header, Ask(), quiet(free=free(ABOVE_THE_FREE)), say=None)
    assert d.plan is None and d.n_ctx == 8192  # 528 MiB of 2.1 GiB: llama.cpp's placement, its training context
    assert d.line.startswith("hypura: fits: llama.cpp's placement (in RAM), context 8192") and "with no margin" in d.line
    assert d.line.endswith("below the 2.0 GiB RAM margin the default path keeps free: other programs' memory may be "
                           "paged out")
    # under what llama.cpp's placement needs, the plan within the free RAM itself, disk for the rest
    d = decide(header, Ask(n_ctx=512), quiet(free=free(300 * MiB)), say=None)
    assert d.plan is not None and d.plan.used("ram") <= 300 * MiB and d.plan.bytes_by_tier()["disk"] > 0
    assert "below the 2.0 GiB RAM margin" in d.line
    # a margin of the user's own (-fitt's RAM part, Fit.ram_margin) leaves the same room
    assert decide(header, Ask(), quiet(free=free(ABOVE_THE_FREE), ram_margin=0), say=None).n_ctx == 8192


# --- hypura.Llama ---------------------------------------------------------------------------------

def _greedy(llm, n=12):
    return [t for _, t in zip(range(n), llm.generate(llm.tokenize(b"The capital of France is"), temp=0.0))]


@pytest.mark.slow
def test_llama_plans_on_the_default_path_and_keeps_explicit_placement(smollm2_path, n_threads):
    from hypura import Llama

    tight = Fit(free=free(TIGHT), measure_profile=False)
    resident = Llama(str(smollm2_path), n_ctx=4096, n_threads=n_threads, verbose=False, fit=False)
    try:
        want = _greedy(resident)
        assert resident.plan is None and resident.fit_decision is None
    finally:
        resident.close()
    planned = Llama(str(smollm2_path), n_ctx=0, n_threads=n_threads, verbose=False, fit=tight)
    try:
        assert planned.plan is not None and planned.plan.tensors_by_tier()["disk"] > 0
        assert planned.n_ctx() == 4096
        assert _greedy(planned) == want  # greedy output under the automatic plan equals resident output
    finally:
        planned.close()
    for explicit in ({"n_gpu_layers": 3}, {"override_tensor": r"blk\.0\.=CPU"}):
        llm = Llama(str(smollm2_path), n_ctx=0, n_threads=n_threads, verbose=False, fit=tight, **explicit)
        try:
            assert llm.plan is None and llm.fit_decision is None  # llama.cpp's placement, as given
        finally:
            llm.close()


def test_llama_loads_smollm2_in_300_mib_of_free_ram_as_llama_cpp_does(smollm2_path, n_threads, monkeypatch):
    """$HYPURA_FREE_MEMORY pinned at 300 MiB: llama_cpp.Llama runs the model there, so hypura.Llama does, with
    llama.cpp's greedy text (its placement: fit=False); 400 MiB holds it as llama.cpp holds it."""
    from hypura import Llama
    from hypura.profile import free as free_probe

    from greedy import assert_same_tokens

    ref = Llama(str(smollm2_path), n_ctx=512, n_threads=n_threads, verbose=False, fit=False)  # llama.cpp's placement
    try:
        want = greedy(ref, ref.tokenize(COUNTING.encode()), 12)
    finally:
        ref.close()
    for ram, planned in (("300MiB", True), ("400MiB", False)):
        monkeypatch.setattr(free_probe, "OVERRIDE", f"gpu=0,ram={ram}")
        llm = Llama(str(smollm2_path), n_ctx=512, n_threads=n_threads, verbose=False)
        try:
            assert (llm.plan is not None) == planned and llm.n_ctx() == 512, ram
            assert "below the 2.0 GiB RAM margin" in llm.fit_decision.line
            assert_same_tokens(greedy(llm, llm.tokenize(COUNTING.encode()), 12).tokens, want, at_least=12)
        finally:
            llm.close()


def test_llama_budgets_larger_than_the_machine_are_refused(smollm2_path):
    from hypura import Llama

    with pytest.raises(HypuraError, match="more than this machine has"):
        Llama(str(smollm2_path), ram="1000TiB", verbose=False, fit=Fit(free=free(TIGHT)))


# --- hypura-cli -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_env():
    """The free RAM limited to TIGHT (the profile is the tests' pinned one: tests/conftest.py)."""
    return dict(os.environ, HYPURA_FREE_MEMORY=f"gpu=0,ram={TIGHT}B")


def _cli(args, env):
    p = subprocess.run(HYPURA_CLI + args, capture_output=True, timeout=300, env=env)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


@pytest.mark.slow
def test_cli_default_path_plans_and_explicit_flags_keep_llama_cpps_placement(smollm2_path, cli_env):
    base = ["-m", str(smollm2_path), "-no-cnv", "-p", COUNTING, "-n", "12", "--temp", "0", "-t", "1"]
    rc, want, err = _cli(base + ["--fit", "off"], cli_env)  # --fit off: llama.cpp's placement, no planning
    assert rc == 0 and "hypura: plan" not in err and "hypura: fits" not in err, err
    rc, out, err = _cli(base + ["--stats"], cli_env)
    assert rc == 0, err
    # streamed weights and llama.cpp's resident placement compute with other kernels on some CPUs (repacked or
    # not): both are held to one-token decoding up to its first near-tie (tests/greedy.py)
    llm = hypura.Llama(str(smollm2_path), n_ctx=256, n_threads=1, verbose=False)
    try:
        decoded = greedy(llm, llm.tokenize(COUNTING.encode()), 12)
    finally:
        llm.close()
    for text in (want, out):  # the prompt, the continuation and the blank line llama-completion ends with
        assert text.decode().startswith(COUNTING) and text.decode().endswith("\n\n"), text
        assert_same_text(text.decode()[len(COUNTING):-2], decoded, at_least=12)
    plan_lines = [line for line in err.splitlines() if "hypura: plan: weights" in line]
    assert len(plan_lines) == 1 and "context 4096" in plan_lines[0] and "disk" in plan_lines[0]
    assert "plan made by --fit from the free memory" in err
    for flags in (["-ngl", "0"], ["-ot", r"blk\.0\.=CPU"], ["-ncffn", "1"]):
        rc, out, err = _cli(base + flags, cli_env)
        assert rc == 0 and out == want and "hypura: plan" not in err, (flags, err)
    rc, out, err = _cli(base + ["-fitc", "1024", "-fitt", "512"], cli_env)
    assert rc == 0 and out == want and "hypura: fits: llama.cpp's placement (in RAM), context 2048" in err


@pytest.mark.parametrize("args, env_ram, message", [
    (["--ram", "1000TiB"], TIGHT, "is more than this machine has"),
    (["-c", "100000000"], TIGHT, "-c 100000000: its KV cache"),
    ([], TOO_LITTLE, "not enough free memory to run"),
    (["--fit", "maybe"], TIGHT, "unknown value for --fit"),
])
def test_cli_bad_input_is_one_line_and_exit_1(smollm2_path, cli_env, args, env_ram, message):
    env = dict(cli_env, HYPURA_FREE_MEMORY=f"gpu=0,ram={env_ram}B")
    rc, out, err = _cli(["-m", str(smollm2_path), "-no-cnv", "-p", "hi", "-n", "2"] + args, env)
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert rc == 1 and len(lines) == 1 and message in lines[0] and "Traceback" not in err, err


# --- llama-cpp-python in the venv -----------------------------------------------------------------

def test_import_llama_cpp_finds_our_library_without_hypura():
    import sysconfig

    from hypura.bindings.library import lib_path

    if not (Path(sysconfig.get_paths()["purelib"]) / "hypura-llama-lib.pth").is_file():
        pytest.skip("not in a venv made by ./build.sh (it installs hypura-llama-lib.pth)")
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "HYPURA_LIB_DIR", "PYTHONPATH")}
    code = "import llama_cpp, os; print(os.path.realpath(llama_cpp.llama_cpp._lib._name))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == os.path.realpath(lib_path())


def test_a_model_larger_than_ram_at_any_context_is_not_blamed_on_its_kv_cache(tmp_path):
    from hypura.synth import writer

    path = tmp_path / "l70.gguf"
    writer.write_synth("llama3.3-70b", path, sparse=True)  # header only: 39.6 GiB of weights, planned, not run
    header = read_header(path)
    d = decide(header, Ask(n_ctx=512), quiet(free=free(20 * GiB)), say=None)
    assert d.plan is not None and d.plan.bytes_by_tier()["disk"] > 20 * GiB and "its KV cache" not in d.line
    # at the training context the KV cache (40 GiB) is the cause, and the line says which -c avoids disk
    d = decide(header, Ask(n_ctx=131072), quiet(free=free(64 * GiB)), say=None)
    assert "-c 131072: its KV cache (40.0 GiB) puts" in d.line and "would keep every weight off disk" in d.line
