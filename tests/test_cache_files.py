"""The files Hypura makes for itself: a corrupt or truncated machine profile, CPU profile or recorded routing is one
warning and made again, never a traceback; a plan file (the user's) is one error line; every one of them is written
whole or not at all."""

from __future__ import annotations

import dataclasses
import os
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from hypura.cachefile import write_atomic
from hypura.errors import HypuraError
from hypura.plan import Plan, plan_model
from hypura.profile import compute, load_profile, measure, store
from hypura.profile.machine import CpuCompute
from hypura.runtime.moe.coactivation import CoactivationPredictor

from conftest import PINNED_PROFILE


def _garbled(valid: bytes) -> dict[str, bytes]:
    """What a crash, a full disk or another program leaves of a file."""
    return {"empty": b"", "truncated": valid[: len(valid) // 2], "binary": b"\xff\xfe\x00\x13garbage\x80",
            "a list": b"[1, 2, 3]\n", "another object": b'{"version": 1}\n'}


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A cache of its own, the machine unpinned (its profile read from the cache), and measurements that return
    fixed results, each one counted."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(store, "PINNED", None)
    facts = (("gpus", "none"), ("hostname", "cachebox"))
    monkeypatch.setattr(store, "hardware_facts", lambda gpus=None: facts)
    monkeypatch.setattr(measure, "hardware_facts", lambda gpus=None: facts)
    profile = dataclasses.replace(load_profile(PINNED_PROFILE), key=store.profile_key(facts), hardware=facts)
    cpu = CpuCompute(20e9, 300e9, 2, "made up", batch_gain=((8, 1.5),), gpu_prefill_flops=0.0)
    measured: list[str] = []
    monkeypatch.setattr(measure, "measure_profile", lambda *a, **k: measured.append("machine") or profile)
    monkeypatch.setattr(compute, "measure_model", lambda *a, **k: measured.append("cpu") or cpu)
    return SimpleNamespace(dir=tmp_path / "hypura", profile=profile, cpu=cpu, measured=measured)


def _plan_profile(model, caught):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        profile = measure.planning_profile(model, say=None)
    caught[:] = [str(x.message) for x in w]
    return profile


@pytest.mark.parametrize("which", ["profile", "cpu"])
def test_a_corrupt_profile_is_one_warning_and_measured_again(cache, tiny_llama, which):
    caught: list[str] = []
    first = _plan_profile(tiny_llama, caught)
    assert cache.measured == ["machine", "cpu"] and caught == [] and first.cpu == cache.cpu
    path = next(cache.dir.glob(f"{which}-*.json"))
    valid = path.read_bytes()
    what = "machine profile" if which == "profile" else "CPU profile"
    for name, data in _garbled(valid).items():
        if which == "cpu" and name == "another object":
            continue  # an older file's fields: measured again without a word, as before (test_cpu_batch_gain.py)
        path.write_bytes(data)
        cache.measured.clear()
        assert _plan_profile(tiny_llama, caught) == first, name
        assert len(caught) == 1 and caught[0].startswith(f"hypura: {what} {path} is corrupt ("), (name, caught)
        assert caught[0].endswith("): ignored and made again")
        assert cache.measured == ["machine" if which == "profile" else "cpu"], name
        assert path.read_bytes() == valid, name  # made again
        assert _plan_profile(tiny_llama, caught) == first and caught == [], name  # and read without a word
    assert sorted(p.name for p in cache.dir.iterdir()) == sorted(p.name for p in cache.dir.glob("*-*.json"))


def test_corrupt_recorded_routing_is_one_warning_and_recorded_again():
    p = CoactivationPredictor(n_layer=2, n_expert=4)
    p.observe(0, [0], [2])
    p.select_many([(0, [[0, 1]]), (1, [[2, 3]])])
    path = p.save("routed")
    valid = path.read_bytes()
    garbled = _garbled(valid)
    np.savez(path.with_name("other.npz"), something=np.zeros(3))
    garbled["another archive"] = path.with_name("other.npz").read_bytes()
    path.with_name("other.npz").unlink()
    for name, data in garbled.items():
        path.write_bytes(data)
        with pytest.warns(UserWarning) as caught:
            cold = CoactivationPredictor.load("routed", 2, 4)
        assert len(caught) == 1 and str(caught[0].message).startswith(f"hypura: recorded routing {path} is corrupt")
        assert not cold.counts.any() and not cold.selections.any() and not path.exists(), name
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # now absent: no word
            assert not CoactivationPredictor.load("routed", 2, 4).counts.any()
        p.save("routed")  # a run records it again
        warm = CoactivationPredictor.load("routed", 2, 4)
        assert np.array_equal(warm.counts, p.counts) and np.array_equal(warm.selections, p.selections)


def test_a_corrupt_plan_file_is_one_error_line_naming_it(tmp_path, tiny_llama):
    """A plan file is the user's (`hypura inspect --json`), not a cache: refused, never remade behind their back."""
    plan = plan_model(tiny_llama, load_profile(PINNED_PROFILE), gpu_mem=0, ram="1GiB")
    path = plan.save(tmp_path / "plan.json")
    assert Plan.load(path) == plan
    for name, data in _garbled(path.read_bytes()).items():
        path.write_bytes(data)
        with pytest.raises(HypuraError) as e:
            Plan.load(path)
        assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value), name


def test_every_file_is_written_whole_or_not_at_all(cache, tiny_llama, tmp_path, monkeypatch):
    """Each writer renames a finished file over the old one; a write that fails leaves the old file and no other."""
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: replaced.append((str(src), str(dst))) or real_replace(src, dst))
    written = [cache.profile.save(store.cache_path(cache.profile.key)), store.save_model_cpu("k", "mix", cache.cpu),
               CoactivationPredictor(2, 4).save("routed"),
               plan_model(tiny_llama, cache.profile, gpu_mem=0, ram="1GiB").save(tmp_path / "plan.json")]
    assert [dst for _, dst in replaced] == [str(p) for p in written]
    assert all(os.path.dirname(src) == os.path.dirname(dst) and src != dst for src, dst in replaced)

    target = tmp_path / "kept.json"
    write_atomic(target, "old\n")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, "new, half written\n")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir() if "kept" in p.name] == ["kept.json"]

