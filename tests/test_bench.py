"""`hypura bench`: llama-bench-style runs with stats and the bound, and one-line errors."""

import json
import subprocess
import sys


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "hypura.cli.main", "bench", *args],
                          capture_output=True, text=True, timeout=300)


def test_bench_streams_and_reports_beside_the_bound(smollm2_path, tmp_path):
    out = tmp_path / "bench.json"
    r = _bench(str(smollm2_path), "--ram", "300MiB", "-p", "16", "-n", "4", "-r", "2", "-t", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert len(res["decode_tok_s"]["runs"]) == 2 and res["decode_tok_s"]["median"] > 0
    assert len(res["prefill_tok_s"]["runs"]) == 2
    decode = res["stats"]["decode"]
    assert decode["tokens"] == 8  # the warm-up is not counted
    assert decode["streamed_bytes_per_token"]["disk"] > 0  # this budget streams layers from disk
    assert res["bound"]["decode_tok_s"] > 0 and res["bound_ratio"] > 0
    mem = res["stats"]["memory"]
    assert mem["rss_peak"] >= mem["rss"] > 0 and mem["budget"]["ram"] == 300 * 2**20 and mem["gpu_used"] is None
    assert "decode" in r.stdout and "bound" in r.stdout and "RSS peak" in r.stdout


def test_bench_errors_are_one_line(smollm2_path):
    r = _bench(str(smollm2_path), "--plan", "p.json", "--ram", "1GiB")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "not both" in r.stderr
    r = _bench("/nonexistent.gguf")
    assert r.returncode == 1 and "no such file" in r.stderr
