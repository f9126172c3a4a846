"""`hypura inspect`: the plan as text, --json, --plot, --tensors, overrides and one-line errors."""

from __future__ import annotations

import json
import struct
import sys
import zlib

import pytest
from click.testing import CliRunner

from hypura.cli.errors import run_cli
from hypura.cli.inspect_cmd import inspect
from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan import Plan
from hypura.synth import writer


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inspect")
    out = {}
    for shape, ftype, layers in (("llama3.3-70b", "q4_k_m", 6), ("mixtral-8x7b", "q5_k_m", 4)):
        path = folder / f"{shape}.gguf"
        writer.write_synth(shape, path, layers=layers, ftype=ftype, sparse=True)
        out[shape] = str(path)
    return out


def run(*args):
    result = CliRunner().invoke(inspect, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, (HypuraError, SystemExit)):
        raise result.exception
    return result


def test_inspect_prints_the_plan(models):
    r = run(models["mixtral-8x7b"], "--profile", "m1-max-32gb", "--gpu-mem", "2GiB", "--ram", "3GiB")
    assert r.exit_code == 0, r.output
    for text in ("model    mixtral-8x7b.gguf: llama, 4 layers", "machine  example-m1-max-32gb",
                 "mode     expert-streaming", "predict  decode", "tok/s (limited by disk)",
                 "streams  ", "prefetch depth 2", "layers   (G gpu", "planned in"):
        assert text in r.output
    assert [line.split()[0] for line in r.output.splitlines() if line.split()[:1] in (["gpu"], ["ram"], ["disk"])][:3] \
        == ["gpu", "ram", "disk"]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):  # walk the chunks, checking each CRC
        n, tag = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(tag + body) & 0xFFFFFFFF
        idat += body if tag == b"IDAT" else b""
        pos += 12 + n
    assert len(zlib.decompress(idat)) == h * (1 + 3 * w)
    return w, h


def test_inspect_json_plot_and_tensors(models, tmp_path):
    plan_file, png = tmp_path / "plan.json", tmp_path / "plan.png"
    r = run(models["llama3.3-70b"], "--profile", "h200-design", "--gpu-mem", "2GiB", "--ram", "64GiB",
            "-c", "8192", "--json", plan_file, "--plot", png, "--tensors")
    assert r.exit_code == 0, r.output
    plan = Plan.load(plan_file)
    assert plan.n_ctx == 8192 and plan.mode in ("mixed", "dense-ffn-streaming")
    header = read_header(models["llama3.3-70b"])
    for t in header.tensors:
        assert plan.tier_of(t.name) in ("gpu", "ram", "disk")
        assert any(line.startswith(t.name + " ") for line in r.output.splitlines())
    assert json.loads(plan_file.read_text())["prediction"]["decode_limit"] in ("gpu", "cpu", "link", "disk")
    w, h = _png_size(png.read_bytes())
    assert w >= 420 and h > 300


def test_overrides_change_the_prediction(models, tmp_path):
    def plan(name, *extra):
        r = run(models["llama3.3-70b"], "--profile", "m1-max-32gb", "--gpu-mem", "1GiB", "--ram", "4GiB",
                "--json", tmp_path / name, *extra)
        assert r.exit_code == 0, r.output
        return Plan.load(tmp_path / name)

    assert plan("fast.json", "--disk-bw", "50").prediction.decode_tok_s > \
        plan("slow.json", "--disk-bw", "1").prediction.decode_tok_s
    no_gpu = plan("cpu.json", "--no-gpu")
    assert no_gpu.config == "cpu only" and no_gpu.memory["gpu"]["weights"] == 0


def test_routing_file(models, tmp_path):
    routing = tmp_path / "routing.json"
    routing.write_text(json.dumps({str(layer): [50, 1, 1, 1, 1, 1, 1, 1] for layer in range(4)}))
    r = run(models["mixtral-8x7b"], "--profile", "h200-design", "--gpu-mem", "2GiB", "--routing", routing,
            "--json", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    routing.write_text("[1, 2]")
    assert isinstance(run(models["mixtral-8x7b"], "--routing", routing).exception, HypuraError)


def test_errors_are_one_line(models, monkeypatch, capsys):
    for argv, message in ((["--gpu-mem", "8 parsecs"], "error: bad size '8 parsecs'"),
                          (["--ram", "100MiB", "--gpu-mem", "0"], "error: no placement fits: ram needs"),
                          (["--profile", "nowhere.json"], "error: profile nowhere.json: no such file")):
        monkeypatch.setattr(sys, "argv", ["hypura-inspect", models["llama3.3-70b"], *argv])
        with pytest.raises(SystemExit) as exit_info:
            run_cli(inspect)
        assert exit_info.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1


def test_default_profile_without_measurement(models, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no cached profile here
    monkeypatch.setattr("hypura.profile.store.PINNED", None)  # nor the tests' pinned one
    monkeypatch.setattr("hypura.profile.store.gpu_devices", lambda: ([], "test"))
    r = run(models["mixtral-8x7b"])
    assert r.exit_code == 0, r.output
    assert "no measured profile of this machine" in r.output


@pytest.fixture(scope="module")
def large_moe(tmp_path_factory):
    """Layer subsets of the largest MoE shapes, header only: deepseek-v3's keeps its 3 dense blocks and 2 MoE ones."""
    folder = tmp_path_factory.mktemp("large-moe")
    return {shape: str(writer.write_synth(shape, folder / f"{shape}.gguf", layers=layers, sparse=True).path)
            for shape, layers in (("qwen3-235b-a22b", 4), ("deepseek-v3", 5), ("gpt-oss-120b", 3))}


@pytest.mark.parametrize("shape", ["qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"])
def test_inspect_prints_hit_rates_and_the_bound(large_moe, shape, tmp_path):
    """The three tiers in use: each tier's share of expert reads is its share of the experts (k/E routing), the
    bound is at least the prediction, and shared experts, routers and attention stay on the GPU."""
    out = tmp_path / "p.json"
    r = run(large_moe[shape], "--profile", "24gb-gpu-64gb", "--gpu-mem", "3GiB", "--ram", "4GiB", "-c", "4096",
            "--json", out, "--tensors")
    assert r.exit_code == 0, r.output
    plan, data = Plan.load(out), json.loads(out.read_text())
    e = data["expected"]
    assert e["routing"] == "k/E" and abs(sum(e["expert_hits"].values()) - 1) < 1e-9
    n = sum(plan.expert_cache.values())
    for tier in ("gpu", "ram", "disk"):
        assert e["expert_hits"][tier] == pytest.approx(plan.expert_cache[tier] / n)
    assert e["expert_hits"]["disk"] > 0 and e["expert_hits"]["ram"] > 0
    assert e["decode_tok_s"] == plan.prediction.decode_tok_s <= e["bound_tok_s"]
    assert e["bound_limit"] == "disk" and e["bound_seconds"]["disk"] == max(e["bound_seconds"].values())
    hits = next(line for line in r.output.splitlines() if line.startswith("hits "))
    assert "(k/E): gpu " in hits and f"disk {e['expert_hits']['disk']:.2f}" in hits
    bound = next(line for line in r.output.splitlines() if line.startswith("bound "))
    assert f"decode {e['bound_tok_s']:.3g} tok/s" in bound and "limited by disk" in bound
    for t in plan.tensors:
        if "_shexp" in t.name or ".ffn_gate_inp" in t.name or ".attn_" in t.name:
            assert t.tier == "gpu", t.name


def test_an_expert_cache_plan_assumes_its_hit_rate(models):
    """With an expert cache the GPU serves its hit rate and RAM the misses; misses load before their experts
    compute, so the bound adds the GPU's and the link's seconds."""
    import dataclasses

    from hypura.plan import plan_model
    from hypura.plan.expected import expected
    from hypura.profile import resolve_profile
    from hypura.units import model_units

    header = read_header(models["mixtral-8x7b"])
    plan = dataclasses.replace(plan_model(header, resolve_profile("h200-design"), gpu_mem="2GiB"), expert_slots=3,
                               expert_hit_rate=0.6)
    e = expected(plan, model_units(header))
    assert e.expert_hits == {"gpu": 0.6, "ram": pytest.approx(0.4), "disk": 0.0}
    assert "expert cache of 3 GPU slots" in e.routing and "gpu+link" in e.bound_seconds
    assert e.bound_tok_s == pytest.approx(1 / max(e.bound_seconds.values()))
