"""The GGUF mutation fuzzer's bounded run (tests/fuzz): CASES mutated files from the three seed models,
each through hypura-cli and hypura.Llama in its own child, with no crash, traceback, hang, unclear
error line or memory blow-up. The long campaign is `python -m tests.fuzz.run --cases 10000 --seed N`."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fuzz.mutators_meta import MUTATIONS
from fuzz.run import SEED_WEIGHTS

CASES, SEED = 300, 23  # about two minutes on two busy cores
ROOT = Path(__file__).resolve().parents[1]  # `python -m tests.fuzz.run` runs from the repository root
TIMEOUT = 1800


@pytest.mark.slow
def test_fuzz_campaign_finds_no_crash(tmp_path):
    out = tmp_path / "outcomes.jsonl"
    run = subprocess.run([sys.executable, "-m", "tests.fuzz.run", "--cases", str(CASES), "--seed", str(SEED),
                          "--quiet", "--json", str(out)], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    bad = [r for r in records if r["outcome"] not in ("clean", "ran")]
    assert not bad, "\n".join(f"case {r['case']} {r['path']} {r['outcome']}: {r['mutation']} -> {r['detail']}"
                              for r in bad[:20])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert len(records) == 2 * CASES
    outcomes = Counter(r["outcome"] for r in records)
    assert outcomes["clean"] and outcomes["ran"]  # files rejected and files that load both occur
    assert {r["kind"] for r in records} == {fn.__name__ for fn, _ in MUTATIONS}
    assert {r["seed_model"] for r in records} == set(SEED_WEIGHTS)
