"""`hypura bench --parallel`: the engine measured as llama-batched-bench measures, beside the bound."""

import json
import subprocess
import sys

import pytest

import hypura
from hypura.plan import Rates
from hypura.speed.batched import BatchBenchSettings, run_batch_bench


def test_each_size_runs_one_prefill_step_then_ntg_decode_steps(tiny_llama):
    s = BatchBenchSettings(n_prompt=8, n_gen=4, parallel=(1, 3), repeats=2)
    llm = hypura.Llama(str(tiny_llama), n_threads=1, n_threads_batch=1, **s.llama_kwargs())
    try:
        r = run_batch_bench(llm.loaded, None, s, rates=Rates(cpu_read=10e9, disk_read=1e9))
    finally:
        llm.close()
    assert [row["parallel"] for row in r["sizes"]] == [1, 3]
    for row in r["sizes"]:
        b = row["parallel"]
        assert len(row["runs"]) == 2 and row["decode_tok_s"]["median"] > 0 and row["prefill_tok_s"]["median"] > 0
        for run in row["runs"]:  # as batched-bench: all prompts in one step, then ntg steps of b tokens
            assert run["prefill_steps"] == 1 and run["decode_steps"] == 4
            assert run["llama_decode_s"] <= run["decode_s"]
        assert row["stats"]["decode"]["tokens"] == 4 * b and row["stats"]["prefill"]["tokens"] == 8 * b
        assert row["bound"]["limit"] == "cpu" and row["bound_ratio"] > 0
    one, three = (row["bound"]["decode_tok_s"] for row in r["sizes"])
    assert three == pytest.approx(3 * one)  # a step reads the weights once for every sequence


@pytest.mark.slow
def test_the_cli_streams_and_writes_json(smollm2_path, tmp_path):
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "hypura.cli.main", "bench", str(smollm2_path), "--ram", "220MiB",
                        "--parallel", "1,2", "-p", "8", "-n", "2", "-r", "1", "-t", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert [row["parallel"] for row in res["sizes"]] == [1, 2] and res["budgets"]["ram"] == "220MiB"
    assert res["plan"]["mode"] != "full-resident"
    assert all(row["stats"]["decode"]["streamed_bytes_per_token"]["disk"] > 0 for row in res["sizes"])
    assert "aggregate decode tok/s" in r.stdout and "bound" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "hypura.cli.main", "bench", str(smollm2_path), "--parallel", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--parallel 'x'" in bad.stderr and bad.stderr.strip().count("\n") == 0
