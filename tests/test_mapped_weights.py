"""A plan's RAM weights at home in the mapped model file (runtime/mapped_weights.py): every weight's bytes where the
mapping says, the pieces pinned cover them and nothing far from them, a cold file's pieces read in, and a model whose
pinned CPU weights live there computes what it computes from llama.cpp's own buffers."""

import dataclasses
import mmap
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import hypura
from hypura.bindings.ffi import ffi
from hypura.errors import HypuraError, ModelFileError
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
    covered = lambda lo, hi: any(a <= lo and hi <= b for a, b in _runs(spans))  # noqa: E731
    assert all(covered(at, at + n) for at, n in [*near, far])
    pinned = sum(b - a for a, b in spans)
    assert pinned <= sum(n for _, n in [*near, far]) + 4 * PAGE  # the gap between the near two, a page at each end


def test_each_weight_lies_whole_in_one_piece(data_file, monkeypatch):
    """CUDA refuses a copy whose host range crosses two registrations: weights packed back to back share pages,
    so a piece is cut only at a page no two weights share, and past PIECE_BYTES where one is."""
    monkeypatch.setattr(mapped_weights, "PIECE_BYTES", 16 * PAGE)
    # 40 weights of 5 pages and 32 bytes, packed (each shares a page with the next), then a gap of a page after
    # the 20th: the one place a piece can end
    weights, at = [], 0
    for k in range(40):
        weights.append((at, 5 * PAGE + 32))
        at += 5 * PAGE + 32 + (PAGE if k == 19 else 0)
    mapped = MappedWeights([str(data_file)], prefetch=False, threads=2)
    try:
        for offset, n in weights:
            mapped.home(info(offset, n))
        pieces = mapped.pieces()
    finally:
        mapped.close()
    spans = sorted((at, at + n) for _, at, n in pieces)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))
    assert all(sum(a <= lo and lo + n <= b for a, b in spans) == 1 for lo, n in weights)
    assert len(spans) == 2  # cut at the gap, though each half is over PIECE_BYTES


class _FakeGpu:
    """Registration as ggml-cuda does it, recorded: refuses the addresses in `refuse`, raises at `fail`."""

    def __init__(self, refuse=(), fail=None):
        self.registered, self.refuse, self.fail = set(), set(refuse), fail

    def register(self, ptr, size):
        addr = int(ffi.cast("uintptr_t", ptr))
        if addr == self.fail:
            raise OSError("the driver went away")
        if addr in self.refuse:
            return False
        assert addr not in self.registered  # each page registered once
        self.registered.add(addr)
        return True

    def unregister(self, ptr):
        self.registered.remove(int(ffi.cast("uintptr_t", ptr)))


def _pinned_with(fake, monkeypatch, data_file, weights, prefetch=False):
    monkeypatch.setattr(mapped_weights, "PIECE_BYTES", 16 * PAGE)
    monkeypatch.setattr(mapped_weights, "_register_fn", lambda: fake.register)
    monkeypatch.setattr(mapped_weights, "_unregister_fn", lambda: fake.unregister)
    mapped = MappedWeights([str(data_file)], prefetch=prefetch, threads=3)
    for offset, n in weights:
        mapped.home(info(offset, n))
    return mapped


SPREAD = [(k * 3 * MERGE_GAP, 20 * PAGE) for k in range(3)]  # three pieces, far apart


def test_pages_the_gpu_refused_stay_pageable_and_the_rest_is_released_at_close(data_file, monkeypatch):
    fake = _FakeGpu()
    mapped = _pinned_with(fake, monkeypatch, data_file, SPREAD)
    fake.refuse = {mapped._maps[0][0] + 3 * MERGE_GAP}
    with pytest.warns(UserWarning, match="did not pin"):
        stats = mapped.pin()
    assert stats.refused == 20 * PAGE and len(fake.registered) == 2
    mapped.close()
    assert fake.registered == set()


def test_a_registration_that_fails_part_way_releases_what_was_registered(data_file, monkeypatch):
    fake = _FakeGpu()
    mapped = _pinned_with(fake, monkeypatch, data_file, SPREAD)
    fake.fail = mapped._maps[0][0] + 6 * MERGE_GAP
    with pytest.raises(OSError, match="went away"):
        mapped.pin()
    assert len(fake.registered) == 2  # the others went through; close() knows them
    mapped.close()
    assert fake.registered == set()


def test_a_read_that_fails_during_the_pin_registers_nothing_and_the_mapping_goes(data_file, monkeypatch):
    fake, unmapped, unmap = _FakeGpu(), [], mapped_weights.unmap
    monkeypatch.setattr(mapped_weights, "unmap", lambda addr, size: (unmapped.append(addr), unmap(addr, size)))

    def failing_read(self, f, at, n):
        raise HypuraError(f"cannot read {data_file} at {at}: Input/output error")

    monkeypatch.setattr(mapped_weights._Prefetch, "read", failing_read)
    mapped = _pinned_with(fake, monkeypatch, data_file, SPREAD, prefetch=True)
    address = mapped._maps[0][0]
    with pytest.raises(HypuraError, match="Input/output error"):
        mapped.pin()
    mapped.close()
    assert fake.registered == set() and unmapped == [address]


def test_a_file_that_cannot_be_mapped_unmaps_the_ones_before_it(data_file, tmp_path, monkeypatch):
    unmapped, unmap = [], mapped_weights.unmap
    monkeypatch.setattr(mapped_weights, "unmap", lambda addr, size: (unmapped.append(size), unmap(addr, size)))
    with pytest.raises(HypuraError, match="cannot map .*missing.gguf"):
        MappedWeights([str(data_file), str(tmp_path / "missing.gguf")], prefetch=False, threads=1)
    assert unmapped == [data_file.stat().st_size]


def test_a_file_changed_in_place_while_mapped_is_a_clear_error(data_file):
    mapped = MappedWeights([str(data_file)], prefetch=False, threads=1)
    try:
        mapped.check()  # unchanged
        with open(data_file, "r+b") as f:
            f.seek(100)
            f.write(b"new bytes")
        os.utime(data_file, ns=(0, 1))  # a write within the clock's tick: the stamp must move
        with pytest.raises(ModelFileError, match="weights.bin changed while in use .it was written to"):
            mapped.check()
        os.truncate(data_file, 1000)
        with pytest.raises(ModelFileError, match="it shrank to 1000 bytes.*the results are void"):
            mapped.check()
    finally:
        mapped.close()


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
        with open(model, "ab") as f:  # the file written to while in use: the next decode's results are void
            f.write(b"\0" * 4096)
        with pytest.raises(ModelFileError, match="moe.gguf changed while in use"):
            logits_by_steps(llm, 1)
    finally:
        llm.close()
