"""`hypura serve -kvu`: the sequences share the KV cache's cells, so a prompt longer than -c is answered, and
/metrics tells the cells and the queue. The real server and SmolLM2-135M; the engine's side:
tests/test_engine_kv_unified.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from serve_helpers import MODEL, engine_of, serving  # noqa: E402

HYPURA = [sys.executable, "-m", "hypura.cli.main"]

PROMPT = "A plan decides where every tensor lives: GPU memory, pinned RAM or disk. " * 10  # ~170 tokens


@pytest.fixture(scope="module")
def server(smollm2_path):
    yield from serving(smollm2_path, parallel=2, n_ctx=128, kv_unified=True)  # 256 cells


def test_a_prompt_longer_than_a_share_is_answered_and_metrics_tell_the_cells(server):
    engine = engine_of(server)
    assert engine.n_ctx_per_seq == 256 and len(engine.tokenize(PROMPT)) > 128
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8
        too_long = c.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT * 2, "max_tokens": 8})
        assert too_long.status_code == 400 and "error" in too_long.json()
        text = c.get("/metrics").text
    assert f'hypura_engine_kv_unified{{model="{MODEL}"}} 1' in text
    assert f'hypura_engine_cells_total{{model="{MODEL}"}} 256' in text
    assert f'hypura_engine_preempted{{model="{MODEL}"}} 0' in text


def test_the_flag_is_documented():
    out = subprocess.run([*HYPURA, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "-kvu, --kv-unified" in out
