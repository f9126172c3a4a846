"""Greedy output of each sequence in a batch equals its output alone, for a dense model (SmolLM2-135M,
tiny-llama) and an MoE one (tiny-qwen3moe), resident and streamed (layers read from disk through a host
slot every step; the MoE's odd experts paged from disk), with a unified KV cache (sequences starting
together) and with one stream per sequence (sequences joining and leaving mid-run, prefixes reused).

Each model runs in a fresh interpreter (tests/engine_invariance.py) with GGML_CPU_TILED_MM_FORCE=1: without
it ggml's CPU backend computes K-quant matmuls of >= 8 rows with other kernels than smaller ones, which
changes a sequence's logits with the batch around it (docs/engine.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).with_name("engine_invariance.py")
CASES = ("resident-unified-together", "resident-split-staggered", "streamed-unified-together",
         "streamed-split-staggered")


def _run(model, kind) -> dict:
    env = dict(os.environ, GGML_CPU_TILED_MM_FORCE="1")
    r = subprocess.run([sys.executable, str(HARNESS), str(model), kind], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check(cases: dict, moe: bool) -> None:
    assert set(cases) == set(CASES)
    for name, c in cases.items():
        assert c["equal"], f"{name}: batch {c['batch']} != alone {c['alone']}"
        assert all(len(t) >= 8 for t in c["batch"])
    # the staggered runs reused their prefixes in place; the streamed ones read weights from disk
    assert cases["resident-split-staggered"]["cached_tokens"] > 0
    for name in ("streamed-unified-together", "streamed-split-staggered"):
        assert (cases[name]["paged_reads"] if moe else cases[name]["streamed_bytes"]) > 0


@pytest.mark.slow
def test_tiny_llama(tiny_llama):
    _check(_run(tiny_llama, "dense"), moe=False)


def test_tiny_qwen3moe(tiny_qwen3moe):
    _check(_run(tiny_qwen3moe, "moe"), moe=True)


@pytest.mark.slow
def test_smollm2(smollm2_path):
    _check(_run(smollm2_path, "dense"), moe=False)
