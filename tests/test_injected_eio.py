"""EIO injected into the model file's reads (eio_shim.c) of hypura-cli and of hypura.Llama, in subprocesses, on
plans the --ram budget forces onto the disk: a dense plan streaming its layers, an MoE plan paging its experts.
The CLI ends with one error line naming the file, status 1, no traceback or abort, whether the fault hits the
load (llama.cpp's O_DIRECT reads) or the decode (Hypura's); a Llama's read error voids that decode alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from injected_faults import budget, faulted_env, one_error_line, pages_experts, streams_layers

HYPURA_CLI = [sys.executable, "-m", "hypura.cli.completion"]
N_CTX = 512
PROMPT = "Once upon a time"
PLANS = {"dense-streamed": ("tiny_llama", streams_layers), "moe-paged": ("tiny_qwen3moe", pages_experts)}


@pytest.fixture(params=sorted(PLANS))
def planned(request):
    """(model, --ram that forces the plan, the plan's name)."""
    fixture, wanted = PLANS[request.param]
    model = request.getfixturevalue(fixture)
    return model, budget(model, N_CTX, wanted), request.param


def _cli(model, ram, *more):
    return HYPURA_CLI + ["-m", str(model), "--ram", ram, "-c", str(N_CTX), "-p", PROMPT, "-no-cnv", "-t", "1",
                         "--temp", "0", *more]


def test_eio_in_the_loads_reads_is_one_line(tiny_llama, eio_shim, tmp_path):
    """Every read of tensor data fails (the header reads): llama.cpp's O_DIRECT load of the RAM layers."""
    from hypura.modelfile import read_header

    fired = tmp_path / "fired"
    env = faulted_env(eio_shim, tiny_llama, start=read_header(tiny_llama).data_offset, fired=fired)
    run = subprocess.run(_cli(tiny_llama, budget(tiny_llama, N_CTX, streams_layers), "-n", "8", "-lm", "dio"),
                         env=env, capture_output=True, text=True, timeout=120)
    line = one_error_line(run.returncode, run.stderr, tiny_llama.name)
    assert "Input/output error" in line and fired.exists() and run.stdout == ""


def test_eio_mid_decode_is_one_line(planned, eio_shim, tmp_path):
    """Reads fail from the moment a generated token is out: the next disk read (a streamed layer, a paged expert)
    fails after its retries, and the CLI stops there."""
    model, ram, _ = planned
    trigger, fired = tmp_path / "faults-on", tmp_path / "fired"
    env = faulted_env(eio_shim, model, trigger=trigger, fired=fired)
    proc = subprocess.Popen(_cli(model, ram, "-n", "400", "--ignore-eos"), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out = _read_past(proc, len(PROMPT))  # the prompt echoed and a token generated: decoding
        trigger.touch()
        rest, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    line = one_error_line(proc.returncode, err.decode(), model.name)
    assert "weights could not be streamed" in line and "Input/output error" in line
    assert fired.exists() and (out + rest).startswith(PROMPT.encode())


def _read_past(proc, n: int, limit_s: float = 120) -> bytes:
    seen, deadline = b"", time.monotonic() + limit_s
    while len(seen) <= n and time.monotonic() < deadline:
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, "the CLI ended before generating"
        seen += chunk
    return seen


# a decode that hit a read error raises; once reads work again, the same Llama computes the same logits
_RECOVERS = """
import os, sys
import numpy as np
import hypura
from hypura.errors import HypuraError

path, ram, trigger = sys.argv[1:]
llm = hypura.Llama(path, ram=ram, n_ctx=512, n_threads=1, logits_all=True, verbose=False)
tokens = llm.tokenize(b"The quick brown fox jumps over the lazy dog. " * 4)

def logits():
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)], copy=True)

want = logits()
open(trigger, "w").close()
try:
    logits()
except HypuraError as e:
    print("raised:", e)
os.remove(trigger)
print("same logits after:", np.array_equal(logits(), want))
llm.close()
"""


def test_a_read_error_voids_one_decode_not_the_model(planned, eio_shim, tmp_path):
    model, ram, _ = planned
    trigger, fired = tmp_path / "faults-on", tmp_path / "fired"
    run = subprocess.run([sys.executable, "-c", _RECOVERS, str(model), ram, str(trigger)], capture_output=True,
                         text=True, timeout=120, env=faulted_env(eio_shim, model, trigger=trigger, fired=fired))
    assert run.returncode == 0, run.stderr[-3000:]
    raised, after = run.stdout.splitlines()
    assert raised.startswith("raised: weights could not be streamed") and model.name in raised
    assert after == "same logits after: True" and fired.exists()
