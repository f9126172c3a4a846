"""The first-use profile: the CPU's rates measured on the model's own blocks (no default model needed,
nothing cached before), cached per machine and model mix; and a first use's RSS within the printed budget."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hypura.models
from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.profile import compute, disk, load_profile, measure, store
from hypura.profile.host import cores
from hypura.profile.model_slice import write_slice
from hypura.synth import write_synth

MiB = 1 << 20


def _data(header, name: str) -> np.ndarray:
    t = next(t for t in header.tensors if t.name == name)
    return np.fromfile(header.path, np.uint8, t.nbytes, offset=t.offset)


@pytest.mark.parametrize("shape", ["tiny_llama", "tiny_qwen3moe"])
def test_a_slice_is_the_models_first_blocks(shape, request, tmp_path):
    whole = read_header(request.getfixturevalue(shape))
    part = read_header(write_slice(whole, 1, tmp_path / "slice.gguf"))
    assert part.n_layer == 1 < whole.n_layer
    assert [t.name for t in part.tensors] == [t.name for t in whole.tensors if t.layer < 1]
    # holes (zeros, never read by the timed steps): the output matrix, and a dense model's embeddings (an MoE
    # model's routers choose from them)
    holes = {"output.weight"} | ({"token_embd.weight"} if shape == "tiny_llama" else set())
    for t in part.tensors:
        if t.name in holes:
            assert not _data(part, t.name).any()
        else:
            assert (_data(part, t.name) == _data(whole, t.name)).all() and t.shape == next(
                w.shape for w in whole.tensors if w.name == t.name)


def test_a_token_reads_k_of_e_experts_as_the_planner_counts_them(tiny_qwen3moe):
    h = read_header(tiny_qwen3moe)
    k, e = int(h.get("expert_used_count")), int(h.get("expert_count"))

    def read(layer):
        return sum(t.nbytes * (k / e if "_exps" in t.name else 1) for t in h.tensors if t.layer == layer)

    assert compute.token_load(h, 1)[0] == pytest.approx(read(0))
    assert compute.token_load(h, 2)[0] == pytest.approx(read(0) + read(1))


@pytest.fixture
def first_use(monkeypatch, tmp_path):
    """A fresh cache, no default model, small disk passes, no GPU: what a first plan measures."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def no_default_model():
        raise HypuraError("default model not installed (this test)")

    monkeypatch.setattr(hypura.models, "default_model_path", no_default_model)
    monkeypatch.setattr(measure, "ram_copy_bw", lambda: 1e10)
    monkeypatch.setattr(measure, "measure_disk", functools.partial(disk.measure_disk, size=16 * MiB, threads=(1,),
                                                                   seconds=0.1))
    monkeypatch.setattr(store, "gpu_devices", lambda: ([], ""))
    monkeypatch.setattr(compute.knobs, "LLAMA_DECODE_S", 1.0)
    return tmp_path / "cache" / "hypura"


@pytest.mark.live_machine  # a first use on purpose: the profile is measured here, on a tiny model
@pytest.mark.parametrize("shape", ["tiny_llama", "tiny_qwen3moe"])
def test_the_first_plan_measures_the_cpu_on_the_models_own_blocks(first_use, shape, request, tmp_path):
    import shutil

    model = shutil.copy(request.getfixturevalue(shape), tmp_path / f"{shape}.gguf")
    said: list[str] = []
    profile = measure.planning_profile(model, say=said.append)
    cpu = profile.cpu
    n = read_header(model).n_layer  # tiny blocks: all of them are timed
    assert cpu.method.startswith(f"llama.cpp on {n} of {shape}.gguf's blocks") and cpu.threads == cores()[0]
    assert cpu.decode_bw > 0 and cpu.prefill_flops > 0
    assert not any("proxy" in n for n in profile.notes)
    assert any("[4/4]" in line for line in said) and any("blocks" in line and "thread" in line for line in said)
    names = sorted(p.name for p in first_use.iterdir())
    assert [n.split("-")[0] for n in names] == ["cpu", "profile"]  # no slice left behind
    assert not any(p.name.startswith(".hypura-profile") for p in first_use.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", f"{shape}.gguf"]  # nothing beside the model

    again: list[str] = []
    assert measure.planning_profile(model, say=again.append).cpu == cpu and again == []  # cached
    # `hypura profile --force --model` measures the model again; without a model nothing is proxied for plans
    forced, _, measured = measure.get_profile(force=True, model=model, progress=lambda m: None)
    assert measured and forced.cpu.method.startswith("llama.cpp on")
    bare, _, _ = measure.get_profile(force=True, progress=lambda m: None)
    assert "proxy" in bare.cpu.method  # no model, no default model: the machine profile says so ...
    assert measure.planning_profile(model, say=again.append).cpu.method.startswith("llama.cpp on")  # ... plans don't


def test_the_model_cpu_cache_is_per_mix_and_threads(tiny_llama, tiny_qwen3moe, tmp_path):
    dense, moe = read_header(tiny_llama), read_header(tiny_qwen3moe)
    # other weights in another file, the same types and shapes: the measurement stands for it too
    other = read_header(write_synth("tiny-llama", tmp_path / "other.gguf", seed=1).path)
    assert other.path != dense.path and store.model_mix(other, 4) == store.model_mix(dense, 4)
    q8 = read_header(write_synth("tiny-llama", tmp_path / "q8.gguf", ftype="q8_0", sparse=True).path)
    mixes = {store.model_mix(dense, 4), store.model_mix(dense, 8), store.model_mix(moe, 4), store.model_mix(q8, 4)}
    assert len(mixes) == 4  # another quantization, other threads, another architecture: each its own


# `hypura` with the disk the pinned profile has (argv[1]) in place of the disk test: how many concurrent readers
# a disk rewards (each a request buffer of RAM within the budget) follows the disk and its load, not the code
_PINNED_DISK = ("import sys; from hypura.profile import load_profile, measure; "
                "disk = load_profile(sys.argv.pop(1)).disk; "
                "measure.measure_disk = measure.measure_file = lambda *args, **kwargs: disk; "
                "from hypura.cli.main import main; sys.argv[0] = 'hypura'; main()")


@pytest.mark.live_machine
@pytest.mark.slow
def test_first_use_rss_stays_within_the_printed_budget(smollm2_path, tmp_path):
    """A first run with no profile cached measures the machine and the model's blocks in the same command;
    the blocks load in a child process, so the run's RSS peak stays within the RAM budget it printed. The disk
    is the pinned profile's (_PINNED_DISK); RAM and the CPU on the model's blocks are measured."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "HYPURA_FREE_MEMORY": "ram=8GiB"}
    pinned = env.pop("HYPURA_PROFILE")  # no profile: the first use measures one
    r = subprocess.run([sys.executable, "-c", _PINNED_DISK, pinned, "bench", str(smollm2_path), "--ram", "250MiB",
                        "-c", "256", "-p", "16", "-n", "4", "-r", "1", "-t", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "no machine profile yet" in r.stderr and "blocks" in r.stderr  # measured now, on the model
    measured = load_profile(next((tmp_path / "cache" / "hypura").glob("profile-*.json")))
    assert measured.disk == load_profile(pinned).disk and measured.cpu.method.startswith("llama.cpp on")
    mem = json.loads(out.read_text())["stats"]["memory"]
    assert mem["rss_peak"] <= mem["budget"]["ram"] == 250 * MiB
