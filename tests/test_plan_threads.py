"""Planning on several threads at once (a server loading two models): each plan is the one its thread would make
alone, never built from another thread's model or budgets."""

from __future__ import annotations

import sys
import threading

import pytest

from hypura.modelfile import read_header
from hypura.plan import PlanSettings, plan_model
from hypura.profile import machine_profile
from hypura.synth import writer

# two models, budgets and contexts, each planned in milliseconds: many plans, many chances to meet
ASKS = {"tiny-llama": ("1GiB", 512), "tiny-qwen3moe": ("140MiB", 256)}
ROUNDS = 1000


@pytest.fixture(scope="module")
def headers(tmp_path_factory):
    out = {}
    for name in ASKS:
        path = tmp_path_factory.mktemp("threads") / f"{name}.gguf"
        writer.write_synth(name, path, sparse=True)  # header only: planned, not run
        out[name] = read_header(path)
    return out


def _plan(header, name):
    ram, n_ctx = ASKS[name]
    return plan_model(header, machine_profile(), gpu_mem=0, ram=ram, settings=PlanSettings(n_ctx=n_ctx)).to_dict()


def test_two_threads_planning_at_once_each_get_their_own_plan(headers):
    alone = {name: _plan(h, name) for name, h in headers.items()}
    assert alone["tiny-llama"] != alone["tiny-qwen3moe"]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: every window a race needs
    got: dict[str, list] = {name: [] for name in headers}
    start = threading.Barrier(len(headers))

    def run(name):
        start.wait()
        for _ in range(ROUNDS):
            got[name].append(_plan(headers[name], name))

    try:
        threads = [threading.Thread(target=run, args=(name,)) for name in headers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    for name in headers:
        assert len(got[name]) == ROUNDS and all(plan == alone[name] for plan in got[name]), name
