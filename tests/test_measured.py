"""What a load's decision reads of this machine (hypura/loaded/measured.py): each source measured only where the
decision first asks, the profile and the RPC devices once per load, what the request gives standing for them."""

from __future__ import annotations

import hypura.profile.measure as measure
import hypura.runtime.device_list as device_list
from hypura.loaded.measured import Measured
from hypura.plan.auto import Fit
from hypura.profile.free import FreeMemory

GiB = 1 << 30


def test_each_source_is_measured_where_asked_and_the_profile_and_devices_once(monkeypatch, tiny_llama):
    calls = {"profile": 0, "devices": 0}

    def planning_profile(path, say, measure=True):
        calls["profile"] += 1
        return f"profile of {path} (measure={measure})"

    def measure_devices(rpc):
        calls["devices"] += 1
        return ("devices", rpc)

    monkeypatch.setattr(measure, "planning_profile", planning_profile)
    monkeypatch.setattr(device_list, "measure", measure_devices)
    m = Measured(str(tiny_llama), None, ("host:1",), Fit(measure_profile=False))
    assert calls == {"profile": 0, "devices": 0}  # nothing measured until the decision asks
    assert m.profile() == m.profile() == f"profile of {tiny_llama} (measure=False)"
    assert m.devices() == m.devices() == ("devices", ("host:1",))
    assert calls == {"profile": 1, "devices": 1}


def test_what_the_request_gives_stands_for_the_measured(monkeypatch, tiny_llama):
    def never(*args, **kwargs):
        raise AssertionError("measured where the request gave it")

    monkeypatch.setattr(measure, "planning_profile", never)
    given = FreeMemory(gpu=None, ram=3 * GiB, gpu_total=None, ram_total=8 * GiB, source="test")
    m = Measured(str(tiny_llama), None, (), Fit(free=given), profile="the caller's profile")
    assert m.free() is given and m.profile() == "the caller's profile"
