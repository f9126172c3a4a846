"""`hypura serve --spec-type ...`: concurrent greedy replies equal the server's without speculation, the
acceptance counters in /metrics agree with the engine's, and bad --spec-* values are one line.

What equals what: the same copy-heavy prompts (tests/test_engine_speculative.py's), sent at once by four
clients, against a server with and without n-gram drafting: both replies are one-token decoding's up to its
first near-tie (tests/greedy.py). The engine starts once all four requests are in, and the draft length is
pinned (--spec-draft-n-min = --spec-draft-n-max) rather than following step times."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from serve_helpers import MODEL, engine_of, real_server, wait_idle  # noqa: E402
from greedy import assert_same_text  # noqa: E402
from test_engine_speculative import N_GEN, PROMPTS, one_token  # noqa: E402,F401  (one_token: a fixture used here)

from hypura.speculative import SpecSettings  # noqa: E402


def _replies(server) -> list[str]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def complete(prompt):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=N_GEN, temperature=0)
        return r.choices[0].text

    engine = engine_of(server)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        # the engine waits until all four requests are in, in order: both servers batch them in the same steps
        replies = []
        with engine._step_lock:
            for prompt in PROMPTS:
                replies.append(pool.submit(complete, prompt))
                deadline = time.monotonic() + 60
                # the first is taken off the queue (then the engine waits for the lock), the others queue behind it
                while engine.metrics()["requests"]["total"] < len(replies) or engine.metrics()["requests"]["queued"] \
                        != len(replies) - 1:
                    assert time.monotonic() < deadline, "the request did not arrive"
                    time.sleep(0.01)
        return [r.result() for r in replies]


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("hypura_engine_speculative_"):
            name, value = line.split(" ")
            out[name.split("{")[0].removeprefix("hypura_engine_speculative_")] = float(value)
    return out


@pytest.mark.slow
def test_replies_equal_with_and_without_speculation_and_metrics_agree(smollm2_path, one_token):
    plain = real_server(smollm2_path, prefix_cache=False)
    try:
        for got, want in zip(_replies(plain), one_token):
            assert_same_text(got, want, at_least=20)
        assert _metrics(plain.url) == {}  # speculation off: no such series
    finally:
        plain.stop()
    spec = SpecSettings(type="ngram-simple", ngram_size_n=3, n_min=8, n_max=8)
    server = real_server(smollm2_path, prefix_cache=False, speculative=spec)
    try:
        for got, want in zip(_replies(server), one_token):
            assert_same_text(got, want, at_least=20)
        engine = wait_idle(engine_of(server))["speculative"]
        m = _metrics(server.url)
        assert m["drafted_tokens"] == engine["drafted_tokens"] and m["accepted_tokens"] == engine["accepted_tokens"]
        assert m["passes"] == engine["passes"] > 0 and 0 < m["steps"] <= m["passes"]
        assert 0 < m["accepted_tokens"] <= m["drafted_tokens"]
        assert m["acceptance"] == pytest.approx(m["accepted_tokens"] / m["drafted_tokens"])
        assert m["accepted_per_pass"] == pytest.approx(m["accepted_tokens"] / m["passes"]) and m["accepted_per_pass"] > 1
    finally:
        server.stop()


@pytest.mark.parametrize("flags, says", [
    (["--spec-type", "ngram-map-k"], "unknown speculative decoding type 'ngram-map-k'"),
    (["--spec-type", "ngram-simple", "--spec-draft-n-max", "x"], "invalid integer 'x'"),
    (["--spec-type", "prompt-lookup", "--spec-draft-n-min", "5", "--spec-draft-n-max", "3"], "n_min 5, n_max 3"),
    (["-md", "no-such-draft.gguf"], "failed to open file 'no-such-draft.gguf'"),
    (["--spec-type", "draft-simple"], "needs a draft model (-md FNAME)"),
    (["-md", __file__, "--spec-tree", "4"], "the engine verifies chains: no --spec-tree"),
])
def test_bad_spec_flags_are_one_line(flags, says):
    proc = subprocess.run([sys.executable, "-m", "hypura.cli.main", "serve", "--port", "0", *flags],
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr
