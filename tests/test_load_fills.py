"""A load's host fills on several threads (runtime/load_fills.py): every byte where it belongs, through the page
cache or around it, and a failed read raised where the load waits for them."""

from types import SimpleNamespace

import numpy as np
import pytest

from hypura.bindings.ffi import ffi
from hypura.errors import HypuraError
from hypura.runtime import load_fills
from hypura.runtime.load_fills import LoadFills


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fills") / "weights.bin"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes())
    return path


def info(offset: int, nbytes: int):
    return SimpleNamespace(file_idx=0, file_offset=offset, nbytes=nbytes)


@pytest.mark.parametrize("cached", [True, False])
def test_every_tensor_lands_whole_in_its_memory(data_file, monkeypatch, cached):
    monkeypatch.setattr(load_fills, "PIECE_BYTES", 100_000)  # many pieces a tensor, none aligned
    data = data_file.read_bytes()
    tensors = [(0, 1), (13, 1_000_003), (1_000_016, 777_777), (len(data) - 4099, 4099)]
    dests = [ffi.new("uint8_t[]", n) for _, n in tensors]
    fills = LoadFills([str(data_file)], cached=cached, threads=3)
    for (offset, n), dest in zip(tensors, dests):
        fills.read_into(info(offset, n), dest)
    fills.wait()
    fills.close()
    for (offset, n), dest in zip(tensors, dests):
        assert bytes(ffi.buffer(dest, n)) == data[offset:offset + n]


def test_a_failed_read_is_raised_where_the_load_waits(data_file):
    fills = LoadFills([str(data_file)], cached=True, threads=2)
    fills.read_into(info(0, 10), ffi.new("uint8_t[]", 10))
    fills.read_into(info(data_file.stat().st_size - 5, 10), ffi.new("uint8_t[]", 10))  # past the end
    with pytest.raises(HypuraError, match="past its end"):
        fills.wait()
    fills.close()  # after a failure: nothing left to raise, readers closed


def test_pinned_cpu_weights_are_left_to_the_fills(smollm2_path):
    """A plan holding its CPU weights pinned defers them to the load's fills where there are some (the loader
    allocates the pinned memory, the fills read into it); without, llama.cpp reads them itself."""
    import dataclasses

    from hypura.plan import PlanSettings, plan_model
    from hypura.profile import machine_profile
    from hypura.runtime.dense.stream_layout import StreamLayout
    from hypura.runtime.placement import Tier
    from hypura.runtime.plan_policy import plan_policy

    plan = plan_model(smollm2_path, machine_profile(), ram="4GiB", settings=PlanSettings(n_ctx=256))
    plan = dataclasses.replace(plan, traffic=dataclasses.replace(plan.traffic, host_pinned=True))
    weight = next(t for t in plan.tensors if t.tier == "ram" and t.layer == 0)
    tensor = SimpleNamespace(name=weight.name)
    deferred = plan_policy(plan, StreamLayout.empty(), defer_pinned=True)(tensor)
    assert (deferred.tier, deferred.defer) == (Tier.PINNED, True)
    assert plan_policy(plan, StreamLayout.empty())(tensor).defer is False
