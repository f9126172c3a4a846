"""The split over several devices is the one decision's (hypura.plan.split through decide()): where it is planned,
what the Decision carries for llama.cpp, where llama.cpp's placement stands instead, and that `hypura inspect
--split` prints the split a load of the same ask makes."""

from __future__ import annotations

import dataclasses

import pytest

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan import knobs
from hypura.plan.ask import Ask, DeviceAsk
from hypura.plan.auto import MIN_CTX
from hypura.plan.decision import decide
from hypura.plan.load_params import Host
from hypura.plan.split import Devices, describe
from hypura.profile import resolve_profile
from hypura.profile.rpc import RpcDevice
from hypura.synth import writer

GiB, MiB = 1 << 30, 1 << 20
MACHINE = Host(gpu=True, cores=8, cpus=16)


@pytest.fixture(scope="module")
def l8(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "l8.gguf"
    writer.write_synth("llama3.1-8b", path, layers=8, ftype="q4_k_m", sparse=True)
    return read_header(path)


@pytest.fixture(scope="module")
def two_gpus():
    h200 = resolve_profile("h200-design")
    g = h200.gpus[0]
    return dataclasses.replace(h200, gpus=(dataclasses.replace(g, index=1, name="CUDA0", mem_free=3 * GiB),
                                           dataclasses.replace(g, index=2, name="CUDA1", mem_free=3 * GiB)))


def _decide(header, profile, devices=Devices(), ask: DeviceAsk = DeviceAsk(), **given):
    """The decision for another machine (`profile`) with the devices measured as `devices`."""
    given.setdefault("devices", ask)
    return decide(header, Ask(**given), None, profile, host=MACHINE, devices=devices)


def test_the_decision_carries_the_split_and_llama_cpps_devices_list(l8, two_gpus):
    d = _decide(l8, two_gpus, ask=DeviceAsk(split=True), ram="8GiB", n_ctx=1024)
    s = d.shares
    assert s is not None and d.plan is None and d.n_ctx == s.n_ctx == 1024 == d.params.n_ctx
    assert d.devices == s.device_names() and set(d.devices) <= {"CUDA0", "CUDA1"}
    assert d.line == f"hypura: devices: {describe(s)}"
    # what the load hands llama.cpp: llama.cpp's layer split, its context in the keywords and the context field
    split = {"n_gpu_layers": s.n_gpu_layers, "tensor_split": list(s.tensor_split()), "n_ctx": 1024}
    assert {k: d.keywords[k] for k in split} == split
    assert d.param_overrides == {"model_params": {"n_gpu_layers": s.n_gpu_layers}, "context_params": {"n_ctx": 1024}}
    # an unset context: --fit-ctx's, or the training context where that is smaller
    assert _decide(l8, two_gpus, ask=DeviceAsk(split=True), ram="8GiB").n_ctx == min(
        int(l8.get("context_length")), MIN_CTX)


@pytest.mark.parametrize("given", [dict(n_gpu_layers=5), dict(placement=True), dict(expert_cache=2),
                                   dict(plan="auto"), dict(devices=DeviceAsk(split=True, tensor_split=True)),
                                   dict(devices=DeviceAsk(split=True, layer_split=False))])
def test_anything_else_that_places_leaves_llama_cpps_placement(l8, two_gpus, given):
    """-ngl N, a placement policy or -ot, an expert cache, a plan, -ts, -sm row: no split planned."""
    ask = dict(ask=DeviceAsk(split=True), **given) if "devices" not in given else given
    if "plan" in ask:
        with pytest.raises(HypuraError, match="give one of plan"):  # a plan beside devices given: refused
            _decide(l8, two_gpus, **ask)
        return
    d = _decide(l8, two_gpus, **ask)
    assert d.shares is None and d.plan is None and d.devices is None and d.line == ""


def test_a_device_list_is_handed_over_as_given(l8, two_gpus):
    d = _decide(l8, two_gpus, ask=DeviceAsk(names=("CUDA1",)))
    assert d.devices == ("CUDA1",) and d.shares is None and d.plan is None
    with pytest.raises(HypuraError, match="give one of plan"):  # budgets make a plan: not beside a device list
        _decide(l8, two_gpus, ask=DeviceAsk(names=("CUDA1",)), gpu_mem="1GiB")


def test_gpus_free_memory_is_measured_now_and_rpc_devices_are_never_among_them(l8, two_gpus):
    """The GPUs' budgets follow their free memory at the load (by ggml index), not the profile's; an RPC device is
    a device of its own, first in llama.cpp's chain, with its own memory."""
    rpc = RpcDevice("RPC0", "127.0.0.1:50052", 5 * GiB, 8 * GiB, 1.1e9, 0.2e-3, 40e9, "fake")
    d = _decide(l8, two_gpus, devices=Devices((rpc,), {1: 2 * GiB, 2: GiB + 256 * MiB}),
                ask=DeviceAsk(rpc_servers="127.0.0.1:50052"), ram="8GiB", n_ctx=1024)
    budgets = {t.name: t.budget for t in d.shares.devices}
    assert budgets == {"RPC0": 5 * GiB - knobs.GPU_MARGIN, "CUDA0": 2 * GiB - knobs.GPU_MARGIN,
                       "CUDA1": GiB + 256 * MiB - knobs.GPU_MARGIN}


def test_inspect_prints_the_split_a_load_of_the_same_ask_makes(tmp_path, l8, two_gpus):
    from click.testing import CliRunner

    from hypura.cli.inspect_cmd import inspect

    profile = two_gpus.save(tmp_path / "two.json")
    r = CliRunner().invoke(inspect, [str(l8.path), "--profile", str(profile), "--split", "--gpu-mem", "1GiB,2GiB",
                                     "--ram", "8GiB", "-c", "1024"])
    assert r.exit_code == 0, r.output
    s = _decide(l8, two_gpus, ask=DeviceAsk(split=True), gpu_mem="1GiB,2GiB", ram="8GiB", n_ctx=1024).shares
    assert f"llama.cpp flags: {s.flags()}" in r.output
    assert f"over {len(s.devices)} device(s) and the host, -c 1024" in r.output


def test_the_loads_measurement_never_asks_an_rpc_device_for_a_gpus_memory(monkeypatch):
    """runtime/device_list.measure: this machine's GPUs only (a dead server's memory query would abort)."""
    from hypura.profile import devices
    from hypura.profile.devices import Device
    from hypura.runtime.device_list import measure

    rpc0 = Device(1, "RPC0", "127.0.0.1:50052", "GPU", 60 * GiB, 64 * GiB, remote=True)
    cuda0 = Device(2, "CUDA0", "NVIDIA H100", "GPU", 70 * GiB, 80 * GiB)
    asked = []

    def listed(remote=True):
        asked.append(remote)
        return [d for d in (rpc0, cuda0) if remote or not d.remote]

    monkeypatch.setattr(devices, "list_devices", listed)
    assert measure(()) == Devices((), {2: 70 * GiB}) and asked == [False]
