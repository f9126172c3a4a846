"""Devices as tiers (hypura.plan.shares): a 70B shape split over 2 and 4 GPUs of unequal memory and links, and
over RPC servers, on header-only synthetic models; the plans, their predictions and the refusals."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan import knobs, model_units
from hypura.plan.shares import ACT_BYTES, DeviceTier, HostTier, device_tiers, plan_shares
from hypura.profile import resolve_profile
from hypura.profile.rpc import RpcDevice
from hypura.synth import writer

GiB = 1 << 30
H200 = resolve_profile("h200-design")
HOST = HostTier(ram=24 * GiB, cpu_read=60e9, disk_read=5e9)


@pytest.fixture(scope="module")
def l70(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "l70.gguf"
    writer.write_synth("llama3.3-70b", path, ftype="q4_k_m", sparse=True)
    return model_units(read_header(path))


def _gpu(name: str, mem_gib: float, read=2.3e12, link=55e9, peer=()) -> DeviceTier:
    return DeviceTier(name, "gpu", int(mem_gib * GiB), read, link, 0.1e-3, peer=peer)


def _rpc(name: str, mem_gib: float, read=60e9, link=1.25e9, latency=0.2e-3) -> DeviceTier:
    return DeviceTier(name, "rpc", int(mem_gib * GiB), read, link, latency, layer_s=knobs.CPU_LAYER_S)


def _layer_bytes(mu) -> int:
    return sum(u.nbytes for u in mu.units if u.stage == 10)


def _check(shares, mu) -> None:
    """Every layer placed once, each device within its budget, the shares what llama.cpp's tensor_split gives."""
    assert shares.host_layers + sum(shares.layers) == mu.dims.n_layer + 1
    for name, held, budget in shares.memory:
        assert held <= budget, (name, held, budget)
    assert len(shares.tensor_split()) == len(shares.device_names())
    assert shares.n_gpu_layers == sum(shares.tensor_split())


def test_two_unequal_gpus_hold_the_70b_in_proportion(l70):
    """24 and 16 GiB hold the 39.6 GiB 70B with a short context: no host layer, the larger GPU the larger share."""
    a, b = _gpu("CUDA0", 24 + 1), _gpu("CUDA1", 16 + 1)
    shares = plan_shares(l70, (a, b), HOST, n_ctx=512, model="l70")
    _check(shares, l70)
    assert shares.host_layers == 0 and shares.host_disk_bytes == 0
    assert shares.layers[0] > shares.layers[1] > 0
    assert shares.flags().startswith("-dev CUDA0,CUDA1 -sm layer -ngl 81 -ts ")
    # the prediction: every weight read once at the GPUs' rate, the fixed costs, and the hand-offs over PCIe
    weights = sum(u.nbytes * u.p for u in l70.units if not u.host_only)
    assert shares.step_s == pytest.approx(weights / 2.3e12 + 81 * knobs.GPU_LAYER_S
                                          + dict(shares.seconds)["hand-offs"], rel=1e-6)
    assert shares.limit in ("CUDA0", "CUDA1")


def test_a_peer_link_makes_the_hand_off_cheaper(l70):
    a, b = _gpu("CUDA0", 25), _gpu("CUDA1", 17)
    plain = plan_shares(l70, (a, b), HOST, n_ctx=512)
    linked = plan_shares(l70, (dataclasses.replace(a, peer=(("CUDA1", 450e9),)), b), HOST, n_ctx=512)
    assert linked.layers == plain.layers
    hop = dict(plain.seconds)["hand-offs"] - dict(linked.seconds)["hand-offs"]
    act = l70.dims.n_embd * ACT_BYTES
    assert hop == pytest.approx(a.hop_s(act) + b.hop_s(act) - act / 450e9, rel=1e-6)


def test_four_gpus_of_unequal_memory_and_a_slow_one(l70):
    """The slow GPU takes only what the fast ones cannot hold; every budget is kept."""
    fast = [_gpu(f"CUDA{i}", m) for i, m in enumerate((13, 13, 9))]
    slow = _gpu("CUDA3", 25, read=0.5e12, link=12e9)
    shares = plan_shares(l70, (*fast, slow), HOST, n_ctx=512)
    _check(shares, l70)
    held = dict((name, h) for name, h, _ in shares.memory)
    for d in fast:  # the fast ones are full ...
        assert d.budget - held[d.name] < _layer_bytes(l70) + l70.dims.kv_bytes_per_layer(512)
    assert 0 < shares.layers[3] < sum(shares.layers[:3])  # ... and the slow one takes the rest
    assert shares.host_layers == 0


def test_what_fits_no_device_stays_on_the_host_then_streams(l70):
    """Two 8 GiB GPUs: the host keeps the first layers in RAM; with too little RAM, the rest streams from disk;
    with the disk off, a refusal that names the sizes."""
    gpus = (_gpu("CUDA0", 9), _gpu("CUDA1", 9))
    shares = plan_shares(l70, gpus, HOST, n_ctx=512)
    _check(shares, l70)
    assert shares.host_layers > 0 and shares.host_disk_bytes == 0 and shares.limit == "host"
    small = dataclasses.replace(HOST, ram=8 * GiB)
    streamed = plan_shares(l70, gpus, small, n_ctx=512)
    assert streamed.host_disk_bytes > 0 and streamed.notes
    assert streamed.step_s > shares.step_s
    with pytest.raises(HypuraError, match=r"does not fit: .* the devices and RAM hold .* \(disk off\)"):
        plan_shares(l70, gpus, dataclasses.replace(small, disk=False), n_ctx=512, model="l70")


def test_a_device_whose_hand_off_costs_more_than_it_saves_is_left_out(l70):
    """An RPC server over a slow, far link with room for 2 layers: the host computes them faster than the round
    trips cost, so it takes none."""
    far = _rpc("RPC0", 2, read=60e9, link=10e6, latency=0.05)
    shares = plan_shares(l70, (far,), dataclasses.replace(HOST, ram=64 * GiB), n_ctx=512)
    assert shares.layers == (0,) and shares.device_names() == () and shares.flags() == "-ngl 0"


def test_rpc_servers_and_a_gpu(l70):
    """The chain llama.cpp builds (RPC servers first, then the GPU holding the head): the hand-offs over the
    network are counted each token, the logits come back over PCIe."""
    rpc = (_rpc("RPC0", 12, read=200e9, link=12.5e9), _rpc("RPC1", 12, read=200e9, link=12.5e9))
    gpu = _gpu("CUDA0", 24)
    shares = plan_shares(l70, (*rpc, gpu), HOST, n_ctx=512)
    _check(shares, l70)
    assert all(shares.layers) and shares.host_layers == 0
    act, logits = l70.dims.n_embd * ACT_BYTES, l70.dims.n_vocab * ACT_BYTES
    hops = sum(d.hop_s(act) * 2 for d in rpc) + gpu.hop_s(act) + gpu.hop_s(logits)
    assert dict(shares.seconds)["hand-offs"] == pytest.approx(hops, rel=1e-6)


def test_bench_reads_llama_cpps_flags_back_from_hypura_clis_devices_line(l70):
    """bench/rpc_cpu.py gives vanilla the split hypura-cli chose from its `hypura: devices:` line: read back, the
    line gives the flags DeviceShares.flags writes, for a split over devices and for one that uses none."""
    from hypura.plan.split import describe

    spec = importlib.util.spec_from_file_location("rpc_cpu", Path(__file__).parents[1] / "bench" / "rpc_cpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rpc = (_rpc("RPC0", 12, read=200e9, link=12.5e9), _rpc("RPC1", 12, read=200e9, link=12.5e9))
    split = plan_shares(l70, (*rpc, _gpu("CUDA0", 24)), HOST, n_ctx=512)
    none = plan_shares(l70, (_rpc("RPC0", 2, link=10e6, latency=0.05),), dataclasses.replace(HOST, ram=64 * GiB),
                       n_ctx=512)
    for shares in (split, none):
        assert bench.split_flags(describe(shares)) == shares.flags().split()
    assert len(split.device_names()) == 3 and none.device_names() == ()
    # vanilla's tries by hand begin with hypura-cli's own split: one configuration on both sides
    two = bench.split_flags("host 1 + RPC0 4 + RPC1 3 of 8 layers")
    tries = bench._neighbours(two)
    assert tries[0] == two and ["-ngl", "7", "-ts", "5,2"] == tries[1][-4:] and len(tries) == 5


def test_device_tiers_from_a_profile_and_measured_rpc_devices():
    """Local GPUs from the profile (budgets: free less the margin, or given; peers by name), RPC devices from
    their measurement, first in the chain as llama.cpp orders them."""
    g = H200.gpus[0]
    profile = dataclasses.replace(H200, gpus=(dataclasses.replace(g, index=0, peer_bw=((1, 400e9),)),
                                              dataclasses.replace(g, index=1, name="CUDA1", peer_bw=((0, 390e9),))))
    rpc = RpcDevice("RPC0", "10.0.0.7:50052", 30 * GiB, 32 * GiB, 1.1e9, 0.3e-3, 21e9, "matvec")
    tiers = device_tiers(profile, (rpc,), gpu_mem=(8 * GiB,), rpc_mem=None)
    assert [t.name for t in tiers] == ["RPC0", "CUDA0", "CUDA1"]
    assert tiers[0].budget == 30 * GiB - knobs.GPU_MARGIN and tiers[0].link_bw == 1.1e9
    assert tiers[0].read_bw == 21e9 and "matvec" in tiers[0].method
    assert tiers[1].budget == 8 * GiB and tiers[2].budget == g.mem_free - knobs.GPU_MARGIN
    assert tiers[1].peer_bw("CUDA1") == 400e9 and tiers[2].peer_bw("CUDA0") == 390e9


def test_the_split_is_exactly_llama_cpps_layer_assignment(l70):
    """The counts as tensor_split give each device exactly its share under llama.cpp's rule
    (llama-model.cpp: layer il goes to the first split point above (il - first) / n_gpu_layers, in float32)."""
    shares = plan_shares(l70, (_gpu("CUDA0", 11), _gpu("CUDA1", 7), _gpu("CUDA2", 5)), HOST, n_ctx=512)
    split = np.array(shares.tensor_split(), dtype=np.float32)
    points = np.cumsum(split, dtype=np.float32) / np.float32(split.sum())
    n_act = shares.n_gpu_layers
    got = [int(np.searchsorted(points, np.float32(i) / np.float32(n_act), side="right")) for i in range(n_act)]
    assert [got.count(d) for d in range(len(split))] == [n for n in shares.layers if n]


def test_inspect_shows_each_devices_share_and_the_bound(tmp_path):
    """`hypura inspect --split` on a profile of 2 unequal GPUs: a row per device with its share, then the bound and
    the llama.cpp flags that load it; the layers over the 8-layer 8B shape add up."""
    from click.testing import CliRunner

    from hypura.cli.inspect_cmd import inspect

    path = tmp_path / "l8.gguf"
    writer.write_synth("llama3.1-8b", path, layers=8, ftype="q4_k_m", sparse=True)
    g = H200.gpus[0]
    two = dataclasses.replace(H200, gpus=(dataclasses.replace(g, index=0, name="CUDA0"),
                                          dataclasses.replace(g, index=1, name="CUDA1", decode_bw=g.decode_bw / 2)))
    profile = two.save(tmp_path / "two.json")
    r = CliRunner().invoke(inspect, [str(path), "--profile", str(profile), "--split", "--gpu-mem", "1.5GiB,2GiB",
                                     "--ram", "8GiB", "-c", "1024"])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split() for line in r.output.splitlines() if line.split()}
    assert int(rows["host"][2]) + int(rows["CUDA0"][2]) + int(rows["CUDA1"][2]) == 9
    assert int(rows["CUDA0"][2]) > 0 and int(rows["CUDA1"][2]) > 0
    assert "tok/s decode (limit: " in r.output and "-dev CUDA0,CUDA1 -sm layer" in r.output
    r = CliRunner().invoke(inspect, [str(path), "--profile", str(profile), "--split", "--gpu-mem", "0.5GiB",
                                     "--ram", "1GiB", "--no-disk", "-c", "1024"])
    assert r.exit_code != 0 and "does not fit" in str(r.exception)


def test_peer_copies_are_timed_between_two_devices_buffers():
    """measure_peer runs on any pair of ggml devices; on a CPU-only build, the CPU with itself (a memcpy)."""
    from hypura.profile.devices import list_devices, measure_peer

    cpu = next(d for d in list_devices() if d.kind == "CPU")
    assert measure_peer(cpu.index, cpu.index, nbytes=8 << 20, repeats=2) > 0
