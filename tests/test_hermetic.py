"""The suite is hermetic (tests/conftest.py): free memory and the machine profile are pinned, and the
live probes fail a test that reaches them without opting in."""

import pytest

from hypura.profile import free, measure, store
from hypura.profile.free import free_memory

GiB = 1 << 30


def test_free_memory_and_profile_are_pinned():
    f = free_memory()
    assert (f.gpu, f.ram, f.source) == (None, 16 * GiB, "$HYPURA_FREE_MEMORY")
    assert store.load_cached().key == "tests-2-core-cpu"
    assert measure.planning_profile(say=None).key == "tests-2-core-cpu"


def test_the_live_probes_fail_a_test_that_did_not_opt_in(request, monkeypatch):
    monkeypatch.setattr(free, "OVERRIDE", "ram=6GiB")  # a part left out is measured
    with pytest.raises(pytest.fail.Exception, match="live free-memory probe"):
        free_memory()
    monkeypatch.setattr(store, "PINNED", None)  # no cached profile (the cache is the session's): measured
    with pytest.raises(pytest.fail.Exception, match="live machine-profile measurement"):
        measure.planning_profile(say=None)
    assert request.node.live_probes == ["the live free-memory probe", "a live machine-profile measurement"]
    request.node.live_probes.clear()  # provoked on purpose


@pytest.mark.live_machine
def test_a_test_that_opts_in_sees_the_machine():
    f = free_memory()
    assert f.source == "measured" and 0 < f.ram <= f.ram_total
    assert store.PINNED is None
