"""A plan's RAM weights at home in the mapped model file (runtime/mapped_weights.py): every weight's bytes where the
mapping says, the pieces pinned cover them and nothing far from them, a cold file's pieces read in, and a model whose
pinned CPU weights live there computes what it computes from llama.cpp's own buffers."""

import dataclasses
import mmap
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import hypura
from hypura.bindings.ffi import ffi
from hypura.errors import HypuraError
from hypura.plan import PlanSettings, plan_model
from hypura.profile import machine_profile
from hypura.runtime import mapped_weights
from hypura.runtime.mapped_weights import MERGE_GAP, MappedWeights
from hypura.tiers.residency import cached_share, evict

from conftest import logits_by_steps

PAGE = mmap.PAGESIZE


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "weights.bin"  # on the test's disk, where eviction works
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes())
    return path


def info(offset: int, nbytes: int, name: str = "w"):
    return SimpleNamespace(name=name, file_idx=0, file_offset=offset, nbytes=nbytes)


def test_a_weight_at_home_reads_its_bytes_from_the_file(data_file):
    data = data_file.read_bytes()
    mapped = MappedWeights([str(data_file)], prefetch=False, threads=2)
    try:
        for offset, n in [(0, 1), (13, 1_000_003), (len(data) - 4099, 4099)]:
            assert bytes(ffi.buffer(mapped.home(info(offset, n)), n)) == data[offset:offset + n]
        with pytest.raises(HypuraError, match="truncated"):
            mapped.home(info(len(data) - 10, 11, "blk.0.ffn_up.weight"))
    finally:
        mapped.close()
    mapped.close()  # twice is safe


def test_the_pinned_pieces_cover_the_weights_and_little_else(data_file, monkeypatch):
    monkeypatch.setattr(mapped_weights, "PIECE_BYTES", 64 * PAGE)  # several pieces a run
    mapped = MappedWeights([str(data_file)], prefetch=False, threads=2)
    try:
        # two weights with a norm's gap between them (one run), and one far away (a GPU layer between: its own run)
        near = [(5, 300_000), (300_100, 900_000)]
        far = (300_100 + 900_000 + 3 * MERGE_GAP, 2_000_000)
        for offset, n in [far, *near]:  # in any order
            mapped.home(info(offset, n))
        pieces = mapped.pieces()
    finally:
        mapped.close()
    spans = sorted((at, at + n) for _, at, n in pieces)
    assert all(a % PAGE == 0 and (b % PAGE == 0 or b == data_file.stat().st_size) for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # disjoint: each registered once
    assert all(b - a <= 64 * PAGE for a, b in spans)
    covered = lambda lo, hi: any(a <= lo and hi <= b for a, b in _runs(spans))  # noqa: E731
    assert all(covered(at, at + n) for at, n in [*near, far])
    pinned = sum(b - a for a, b in spans)
    assert pinned <= sum(n for _, n in [*near, far]) + 4 * PAGE  # the gap between the near two, a page at each end


def _runs(spans):
    runs = []
    for a, b in spans:
        if runs and a == runs[-1][1]:
            runs[-1][1] = b
        else:
            runs.append([a, b])
    return runs


def test_a_cold_files_weights_are_read_in_and_the_rest_is_not(data_file):
    evict(data_file)
    assert cached_share(data_file) < 0.05
    mapped = MappedWeights([str(data_file)], prefetch=True, threads=3)
    try:
        mapped.home(info(1 << 20, 3 << 20))
        stats = mapped.pin()
    finally:
        mapped.close()
    assert stats.nbytes >= 3 << 20 and stats.refused == 0 and "in the page cache" in stats.line
    assert cached_share(data_file, 1 << 20, 4 << 20) == 1.0
    assert cached_share(data_file, 6 << 20, 12 << 20) < 0.05


# --- a model's pinned CPU weights at home there (CPU; the GPU test registers them too) ---------------------------

PLAIN = {"model_params": {"use_extra_bufts": False}}  # the plan's pinned weights are in ggml's plain layout


@pytest.mark.slow
def test_pinned_cpu_weights_at_home_in_the_mapping_compute_the_same(tiny_qwen3moe, n_threads, tmp_path):
    model = tmp_path / "moe.gguf"
    shutil.copyfile(tiny_qwen3moe, model)
    plan = plan_model(model, machine_profile(), ram="4GiB", settings=PlanSettings(n_ctx=256))
    pinned = dataclasses.replace(plan, traffic=dataclasses.replace(plan.traffic, host_pinned=True))
    kwargs = dict(n_ctx=256, n_batch=512, logits_all=True, n_threads=n_threads, verbose=False, param_overrides=PLAIN)
    llm = hypura.Llama(str(model), plan=plan, **kwargs)
    try:
        assert llm._runtime.mapped is None  # nothing pinned: llama.cpp's own buffers
        want = {k: logits_by_steps(llm, k) for k in (1, 512)}
    finally:
        llm.close()
    evict(model)  # the weights at home come from the file's pages, read in at load
    llm = hypura.Llama(str(model), plan=pinned, **kwargs)
    try:
        cpu_weights = sum(t.nbytes for t in pinned.tensors if t.tier == "ram")
        assert llm._runtime.mapped.stats.nbytes >= cpu_weights > 0
        for k in (1, 512):
            assert np.array_equal(logits_by_steps(llm, k), want[k])
    finally:
        llm.close()
