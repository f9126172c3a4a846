"""bench/extrapolate.py: a layer subset's budgets keep the full model's tier shares, and the fit of subset runs
gives the full depth's decode (docs/large-moe.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hypura.synth.writer import write_synth

ROOT = Path(__file__).resolve().parents[1]


def _extrapolate(*args) -> dict:
    r = subprocess.run([sys.executable, "-m", "bench.extrapolate", *map(str, args)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def depths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("extrapolate")
    return {n: write_synth("qwen3-30b-a3b", folder / f"L{n}.gguf", layers=n, sparse=True).path for n in (2, 4, 12)}


@pytest.mark.slow
def test_subset_budgets_keep_the_tier_shares(depths):
    for n in (2, 4):
        d = _extrapolate("budgets", depths[12], depths[n], "--profile", "h200-design", "--gpu-mem", "0",
                         "--ram", "2500MiB", "-c", "512")
        full, sub = d["full"], d["subset"]
        assert sub["layers"] == n and sub["ram"] < full["ram"]
        assert full["block_bytes"]["disk"] > 0.3  # the RAM budget puts experts on disk
        for tier in ("gpu", "ram", "disk"):
            assert sub["block_bytes"][tier] == pytest.approx(full["block_bytes"][tier], abs=0.01)
            assert sub["expert_reads"][tier] == pytest.approx(full["expert_reads"][tier], abs=0.05)
        assert f"--ram {sub['ram'] >> 20}MiB" in d["bench"]


def test_the_fit_recovers_a_linear_cost(depths, tmp_path):
    """Runs whose token time is a fixed part plus a cost per block byte: the full depth's predicted exactly."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench.extrapolate import block_reads
    finally:
        sys.path.remove(str(ROOT))
    from hypura.modelfile import read_header

    fixed, per_byte = 0.02, 0.25e-9

    def run(n: int, name: str) -> Path:
        tok_s = 1 / (fixed + per_byte * block_reads(read_header(depths[n])))
        path = tmp_path / name
        path.write_text(json.dumps({"model": str(depths[n]),
                                    "decode_tok_s": {"median": tok_s, "min": tok_s, "max": tok_s, "runs": [tok_s]},
                                    "stats": {"decode": {"tokens": 10, "seconds": 10 / tok_s,
                                                         "stall_ms_per_token": 0.0}}}))
        return path

    d = _extrapolate("predict", run(2, "a.json"), run(4, "b.json"), "--full", depths[12], "--measured",
                     run(12, "c.json"))
    assert d["fixed_s"] == pytest.approx(fixed) and d["s_per_block_gb"] == pytest.approx(per_byte * 1e9)
    assert d["error"] == pytest.approx(0, abs=1e-9) and d["full_blocks"] == 12
    assert d["predicted_busy_s"] == pytest.approx(1 / d["predicted_tok_s"])
