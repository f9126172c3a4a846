"""A model file cut while a streamed or paged model decodes: the next read of its weights fails with
a DiskReadError naming the file and the offset (hypura-cli: one error line, exit status 1), never a
crash or a hang. Each test cuts a copy of the model, on the disk (tmp_path)."""

import dataclasses
import os
import shutil
import subprocess
import sys

import pytest

import hypura
from hypura.errors import HypuraError
from hypura.plan import PlanSettings, RateOverrides, plan_model
from hypura.profile import machine_profile, resolve_profile
from hypura.tiers.direct_io import DiskReadError

PROMPT = "The quick brown fox jumps over the lazy dog."
TIMEOUT = 300


@pytest.fixture
def smollm2_copy(smollm2_path, tmp_path):
    return shutil.copy(smollm2_path, tmp_path / "smollm2.gguf")


@pytest.fixture
def moe_copy(tiny_qwen3moe, tmp_path):
    return shutil.copy(tiny_qwen3moe, tmp_path / "moe.gguf")


def _streamed_plan(path):
    """SmolLM2 with every block on disk, streamed through two host-pool slots."""
    plan = plan_model(path, machine_profile(), ram="4GiB", settings=PlanSettings(n_ctx=256))
    tensors = tuple(dataclasses.replace(t, tier="disk") if 0 <= t.layer < plan.n_layer else t for t in plan.tensors)
    return dataclasses.replace(plan, tensors=tensors, staging_slots=2, prefetch_depth=1)


def _paged_plan(path):
    """tiny-qwen3moe with its odd experts on disk, read when the router selects them."""
    plan = plan_model(path, resolve_profile("h200-design"), overrides=RateOverrides(no_gpu=True))

    def with_disk(t):
        if not t.experts:
            return t
        return dataclasses.replace(t, tier="disk", experts=tuple("disk" if e % 2 else "ram" for e in range(16)))

    return dataclasses.replace(plan, tensors=tuple(map(with_disk, plan.tensors)))


def _cut_after_first_token(llm, path):
    """Stream a completion, cut the file to a third when the first token is out, go on decoding."""
    tokens = 0
    with pytest.raises(HypuraError) as info:
        for _ in llm.create_completion(PROMPT, max_tokens=200, temperature=0, stream=True):
            tokens += 1
            if tokens == 1:
                os.truncate(path, os.path.getsize(path) // 3)
    assert tokens < 200
    return info.value


def _names_file_and_offset(error, path):
    cause = error if isinstance(error, DiskReadError) else error.__cause__
    assert isinstance(cause, DiskReadError), repr(error)
    assert str(path) in str(cause) and "byte" in str(cause), str(cause)


def test_cutting_a_streamed_model_while_it_decodes_raises_disk_read_error(smollm2_copy):
    llm = hypura.Llama(str(smollm2_copy), plan=_streamed_plan(smollm2_copy), n_ctx=256, n_threads=1, verbose=False)
    try:
        error = _cut_after_first_token(llm, smollm2_copy)
        _names_file_and_offset(error, smollm2_copy)
        assert "shrank" in str(error)
    finally:
        llm.close()


def test_cutting_a_paged_model_while_it_decodes_raises_disk_read_error(moe_copy):
    llm = hypura.Llama(str(moe_copy), plan=_paged_plan(moe_copy), n_ctx=256, n_threads=1, verbose=False)
    try:
        assert llm._pager is not None
        _names_file_and_offset(_cut_after_first_token(llm, moe_copy), moe_copy)
    finally:
        llm.close()


@pytest.mark.parametrize("paged", [False, True], ids=["streamed", "paged"])
def test_hypura_cli_exits_1_with_one_line_when_the_file_is_cut(smollm2_copy, moe_copy, paged, tmp_path):
    path = moe_copy if paged else smollm2_copy
    plan = (_paged_plan if paged else _streamed_plan)(path).save(tmp_path / "plan.json")
    proc = subprocess.Popen([sys.executable, "-m", "hypura.cli.completion", "-m", str(path), "-p", PROMPT, "-n", "200",
                             "-no-cnv", "-c", "256", "--plan", str(plan), "--temp", "0", "-t", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    while len(out) <= len(PROMPT) + 1:  # the echoed prompt, then a generated token
        chunk = os.read(proc.stdout.fileno(), 256)
        assert chunk, proc.stderr.read().decode()[-2000:]
        out += chunk
    os.truncate(path, os.path.getsize(path) // 3)
    rest, err = proc.communicate(timeout=TIMEOUT)
    err = err.decode()
    assert proc.returncode == 1, err[-2000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and str(path) in last and "byte" in last, last
