"""A plan's load reads a file the page cache holds through the cache, and a cold one around it (O_DIRECT)."""

import os
import shutil

import llama_cpp
import numpy as np
import pytest

import hypura
from hypura.plan.auto import Fit
from hypura.runtime.load_reads import CACHED_MIN, load_reads
from hypura.tiers.direct_io import DirectReader
from hypura.tiers.residency import cached_share, evict, uncached_runs, windows


@pytest.fixture
def model_copy(tiny_llama, tmp_path):
    """A file of our own to evict and cache (on the test's disk, where O_DIRECT and mincore work)."""
    path = tmp_path / "model.gguf"
    shutil.copyfile(tiny_llama, path)
    return path


def _warm(path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


def test_residency_follows_eviction_and_reads(model_copy):
    evict(model_copy)
    assert cached_share(model_copy) < 0.05
    _warm(model_copy)
    assert cached_share(model_copy) == 1.0


def test_a_huge_file_is_sampled():
    spots = windows(100 << 30)
    assert 1 < len(spots) <= 256 and spots[-1][0] < 100 << 30
    assert all(off % 4096 == 0 for off, _ in spots)
    assert windows(10 << 20) == [(0, 10 << 20)]


def test_the_decision_follows_the_cache(model_copy):
    evict(model_copy)
    cold = load_reads([model_copy])
    assert not cold.buffered and cold.load_mode == llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO and "O_DIRECT" in cold.line
    _warm(model_copy)
    warm = load_reads([model_copy])
    assert warm.buffered and warm.share >= CACHED_MIN and warm.load_mode == llama_cpp.LLAMA_LOAD_MODE_NONE
    # a load mode the caller gave stands, whatever the cache holds
    asked = load_reads([model_copy], llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO)
    assert asked.asked and not asked.buffered


def test_a_partly_cached_file_reads_through_the_cache_and_leaves_it_as_it_was(model_copy):
    size = model_copy.stat().st_size
    evict(model_copy)
    with open(model_copy, "rb") as f:  # the first three quarters cached, as an earlier run under pressure leaves it
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead past them
        f.read(size * 3 // 4)
    before = cached_share(model_copy)
    assert CACHED_MIN <= before < 1.0
    reads = load_reads([model_copy])
    assert reads.buffered and reads.cold and "leaves it after the load" in reads.line
    runs = dict(reads.cold)[str(model_copy)]
    assert runs == uncached_runs(model_copy) and runs[-1][0] + runs[-1][1] >= size
    _warm(model_copy)  # the load, through the cache
    assert cached_share(model_copy) == 1.0
    reads.settle()
    assert cached_share(model_copy) == pytest.approx(before, abs=0.02)  # the cache as it was before the load
    assert cached_share(model_copy, runs[0][0] + 4096, size - 4096) == 0.0


def test_cached_reads_keep_the_pages_and_direct_ones_add_none(model_copy):
    size = model_copy.stat().st_size
    evict(model_copy)
    with DirectReader(model_copy) as r:
        assert r.direct
        got = bytearray(size)
        r.read_into(0, size, memoryview(got))
    assert cached_share(model_copy) < 0.05  # O_DIRECT: nothing of the cold file came into the cache
    _warm(model_copy)
    with DirectReader(model_copy, cached=True) as r:
        assert not r.direct
        again = bytearray(size)
        r.read_into(0, size, memoryview(again))
    assert again == got == model_copy.read_bytes()
    assert cached_share(model_copy) == 1.0  # read through the cache, which keeps the file


@pytest.mark.slow
def test_a_plan_loads_a_cached_file_through_the_cache_and_a_cold_one_around_it(model_copy, n_threads,
                                                                                prompt_logits, monkeypatch):
    """The same plan (streamed layers: pinned-RAM and disk fills beside llama.cpp's own reads) from a cold file,
    then from a cached one: what the loader chose, what the cache holds after, the same logits."""
    import hypura.runtime.runtime as runtime

    measured = runtime.load_reads

    def cold_then_measured(paths, given=None):  # reading the header read all of so small a file ahead: evicted
        for p in paths:
            evict(p)
        return measured(paths, given)

    logits, modes = {}, {}
    for state in ("cold", "cached"):
        if state == "cold":
            monkeypatch.setattr(runtime, "load_reads", cold_then_measured)
        else:
            monkeypatch.setattr(runtime, "load_reads", measured)
            _warm(model_copy)
        lines = []
        llm = hypura.Llama(str(model_copy), ram="143MiB", n_ctx=256, logits_all=True, n_threads=n_threads,
                           verbose=False, fit=Fit(say=lines.append))
        try:
            assert llm.plan.tensors_by_tier()["disk"] > 0  # the budget streams from disk
            modes[state] = (llm._runtime.reads.buffered, llm.model_params.load_mode)
            assert any(line.startswith("hypura: load: ") for line in lines)
            logits[state] = prompt_logits(llm)
        finally:
            llm.close()
        if state == "cold":  # loaded with O_DIRECT and decoded from disk: the weights did not enter the cache
            # (llama.cpp parses the header with buffered reads, which the kernel reads ahead of by up to
            # read_ahead_kb, and reads the file's last partial block so: the second half, less its end, is looked at)
            size = model_copy.stat().st_size
            assert cached_share(model_copy, size // 2, size - (64 << 10)) < 0.05
    assert modes == {"cold": (False, llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO),
                     "cached": (True, llama_cpp.LLAMA_LOAD_MODE_NONE)}
    assert np.array_equal(logits["cold"], logits["cached"])
