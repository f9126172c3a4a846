"""Machine profile: JSON round-trip, cache and staleness, the disk test with and without O_DIRECT,
RAM copy, ggml device links (on the CPU device here) and the llama.cpp compute run."""

from __future__ import annotations

import dataclasses
import errno
import os
import functools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hypura.errors import HypuraError
from hypura.plan import budgets_for
from hypura.profile import MachineProfile, example_names, load_profile, quick_profile, resolve_profile
from hypura.profile import compute, disk, measure, store
from hypura.profile.host import ram_copy_bw
from hypura.tiers.direct_io import DIRECT_ALIGN, O_DIRECT, aligned_buffer, no_cache

MiB = 1 << 20


@pytest.mark.parametrize("name", example_names())
def test_example_profiles_round_trip(name):
    p = resolve_profile(name)
    assert MachineProfile.from_json(p.to_json()) == p
    assert p.gpu is not None and p.disk.read_bw > 0


def test_seed_example_is_the_seed_machine():
    p = resolve_profile("m1-max-32gb")
    assert p.gpu.unified and p.disk.read_bw == 5.1e9 and p.host.ram_total == 32 << 30
    b = budgets_for(p)
    assert b.unified and b.gpu == p.gpu.mem_free - (1 << 30) and b.ram == p.host.ram_available - (2 << 30)


def test_bad_profiles_are_user_errors(tmp_path):
    with pytest.raises(HypuraError, match="schema"):
        MachineProfile.from_json("{}")
    with pytest.raises(HypuraError, match="not JSON"):
        MachineProfile.from_json("{")
    with pytest.raises(HypuraError, match="cannot read"):
        load_profile(tmp_path / "missing.json")
    with pytest.raises(HypuraError, match="m1-max-32gb"):
        resolve_profile("no-such-machine")
    broken = json.loads(resolve_profile("m1-max-32gb").to_json())
    del broken["host"]["ram_total"]
    with pytest.raises(HypuraError, match="ram_total"):
        MachineProfile.from_dict(broken)


def test_disk_reads_bypass_the_page_cache(tmp_path):
    d = disk.measure_disk(tmp_path, size=16 * MiB, threads=(1, 2), seconds=0.3)
    assert d.read_bw > 0 and [t for t, _ in d.by_threads] == [1, 2]
    assert d.request_bytes == 4 * MiB
    # and at random offsets in expert-sized requests, as decode reads experts
    assert d.random_request_bytes == MiB and [t for t, _ in d.random_by_threads] == [1, 2]
    assert d.random_read_bw == max(bw for _, bw in d.random_by_threads) > 0
    again = MachineProfile.from_json(dataclasses.replace(resolve_profile("h200-design"), disk=d).to_json())
    assert again.disk == d
    assert d.direct_io == d.method.startswith("O_DIRECT write")
    assert list(tmp_path.iterdir()) == []  # the test file is gone


def test_disk_without_o_direct_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "O_DIRECT", 0)
    d = disk.measure_disk(tmp_path, size=16 * MiB, threads=(1,), seconds=0.2)
    assert not d.direct_io and "posix_fadvise(DONTNEED)" in d.method


def _takes_direct_reads(path: Path) -> bool:
    """Whether `path`'s filesystem takes an O_DIRECT read (asked of the kernel, not of the code under test)."""
    try:
        fd = os.open(path, os.O_RDONLY | O_DIRECT)
        try:
            no_cache(fd)
            os.preadv(fd, [aligned_buffer(DIRECT_ALIGN)], 0)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return False
    return True


def test_the_models_disk_is_measured_by_reading_the_model(tmp_path):
    model = tmp_path / "model.gguf"
    with open(model, "wb") as f:
        f.write(os.urandom(MiB) * 96)  # 4 passes of 24 MiB regions: six 4 MiB requests each
    if not _takes_direct_reads(model):  # tmpfs before Linux 6.6: the measurement says so, in one line
        with pytest.raises(HypuraError, match=r"disk test on .*model\.gguf failed"):
            disk.measure_file(model, threads=(1, 2), seconds=0.2)
        return
    d = disk.measure_file(model, threads=(1, 2), seconds=0.2)
    assert d.read_bw > 0 and d.random_read_bw > 0 and d.direct_io and "model.gguf" in d.method
    assert d.path == str(tmp_path.resolve()) and model.stat().st_size == 96 * MiB  # read only
    with pytest.raises(HypuraError, match="too small"):
        disk.measure_file(model, threads=(1, 2, 4, 8), request=8 * MiB)


def test_disk_errors(tmp_path):
    with pytest.raises(HypuraError, match="not a directory"):
        disk.measure_disk(tmp_path / "nope")


def test_ram_copy_bandwidth():
    assert ram_copy_bw(8 * MiB, 2) > 1e8


def test_device_links_code_path_on_cpu_device():
    """The pinned/pageable/device-copy path the H200 runs, exercised on the CPU device."""
    from hypura.profile.devices import list_devices, measure_links

    cpu = next(d for d in list_devices() if d.kind == "CPU")
    links = measure_links(cpu.index, nbytes=4 * MiB, repeats=2, d2d_repeats=2)
    assert links.h2d_pageable_bw > 0 and links.d2d_bw > 0
    assert links.h2d_pinned_bw is None or links.h2d_pinned_bw > 0  # the CPU has no host buffer type


@pytest.mark.slow
@pytest.mark.live_machine  # measures the CPU on a model on purpose
def test_llama_cpp_compute_rate(monkeypatch, tmp_path):
    from hypura.models import default_model_path

    model = default_model_path()  # installed by ./build.sh: its absence fails, as any broken setup
    monkeypatch.setattr(compute.knobs, "LLAMA_PROMPT_TOKENS", 8)
    monkeypatch.setattr(compute.knobs, "LLAMA_DECODE_TOKENS", 4)
    monkeypatch.setattr(compute.knobs, "LLAMA_DECODE_S", 1.0)
    c = compute.measure_model(model, 2, tmp_path)
    assert c.decode_bw > 0 and c.prefill_flops > 0 and "llama.cpp on" in c.method
    # SmolLM2's Q4_1/Q8_0 are never repacked: both layouts are one kernel, and paired steps say so under any load
    assert 0 < c.decode_bw_plain <= c.decode_bw and c.decode_bw_plain > 0.5 * c.decode_bw
    # a batched step and the prompt, each beside the cost model's sum for it
    assert [k for k, _ in c.batch_gain] == [compute.knobs.LLAMA_BATCH_TOKENS, compute.knobs.LLAMA_PROMPT_TOKENS]
    assert all(g > 0 for _, g in c.batch_gain)
    assert list(tmp_path.iterdir()) == []  # the copies of its blocks are gone


@pytest.fixture
def fast_measure(monkeypatch, tmp_path):
    """measure_profile with small real disk/RAM tests and no llama.cpp run; cache in tmp."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "ram_copy_bw", lambda: 1e10)
    monkeypatch.setattr(measure, "measure_disk", functools.partial(
        disk.measure_disk, size=16 * MiB, threads=(1,), seconds=0.1))
    monkeypatch.setattr(store, "gpu_devices", lambda: ([], ""))

    def no_llama(model, threads, folder, progress):
        raise HypuraError("not in this test")

    monkeypatch.setattr(compute, "measure_model", no_llama)
    return tmp_path


@pytest.mark.live_machine  # measures on purpose: small real disk reads, the rest faked
def test_profile_is_cached_and_goes_stale(fast_measure, monkeypatch):
    models = fast_measure / "models"
    models.mkdir()
    first, path, measured = measure.get_profile(path=models, progress=lambda m: None)
    assert measured and path.is_file() and path.name == f"profile-{first.key}.json"
    assert path.parent == fast_measure / "cache" / "hypura"
    assert load_profile(path) == first
    assert "proxy" in first.cpu.method and any("proxy" in n for n in first.notes)

    again, _, measured = measure.get_profile(path=models, progress=lambda m: None)
    assert not measured and again == first
    _, _, measured = measure.get_profile(force=True, path=models, progress=lambda m: None)
    assert measured

    facts = dict(store.host_facts())
    monkeypatch.setattr(store, "host_facts", lambda: {**facts, "ram_gib": "4096"})  # new hardware
    assert store.load_cached() is None
    changed, _, measured = measure.get_profile(path=models, progress=lambda m: None)
    assert measured and changed.key != first.key


@pytest.mark.live_machine
def test_tmpfs_disk_is_flagged(fast_measure):
    if disk.fs_type(Path("/dev/shm")) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    p = measure.measure_profile(path="/dev/shm", progress=lambda m: None)
    assert any("not a storage figure" in n for n in p.notes)


def test_quick_profile_uses_labelled_defaults(monkeypatch):
    monkeypatch.setattr(store, "gpu_devices", lambda: ([], "no device list (test)"))
    q = quick_profile()
    assert q.gpus == () and "not measured" in q.disk.method and "not measured" in q.cpu.method
    assert any("quick profile" in n for n in q.notes)


def test_profile_cli(monkeypatch):
    from hypura.cli.profile_cmd import profile

    example = resolve_profile("h200-design")
    monkeypatch.setattr("hypura.cli.profile_cmd.get_profile",
                        lambda **kw: (example, Path("/cache/profile-x.json"), False))
    out = CliRunner().invoke(profile, ["--json"])
    assert out.exit_code == 0 and MachineProfile.from_json(out.output) == example
    out = CliRunner().invoke(profile, [])
    assert out.exit_code == 0
    for text in ("h2d pinned", "55.0 GB/s", "4.28 TB/s", "cached at /cache/profile-x.json"):
        assert text in out.output
