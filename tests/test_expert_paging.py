"""Disk-tier experts read by selection (hypura.runtime.moe.expert_paging) on the CPU: bitwise logits, disk
reads only for selected experts counted against a hand-made routing trace, the budget, read errors, a tie plan's
RAM experts in the pager's LRU."""

import dataclasses
import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import hypura
from hypura.bindings.ffi import ffi, lib
from hypura.errors import HypuraError
from hypura.plan import RateOverrides, plan_model
from hypura.plan.load_params import llama_threads
from hypura.profile import host, resolve_profile
from hypura.runtime.moe import expert_paging
from hypura.tiers.direct_io import DirectReader, DiskReadError
from hypura.runtime.placement import FileFiller
from routing_trace import RoutingTrace

K, N_EXPERT, LAYERS = 4, 16, (0, 1)  # tiny-qwen3moe
TEXT = b"The quick brown fox jumps over the lazy dog. " * 3
ON_DISK = frozenset(range(1, N_EXPERT, 2))  # odd experts live on disk


def _plan(model):
    """A CPU plan with every stacked expert tensor's odd experts on disk; no recorded routing (a tie plan: its
    RAM experts join the pager's LRU)."""
    plan = plan_model(model, resolve_profile("h200-design"), overrides=RateOverrides(no_gpu=True))

    def with_disk(t):
        if not t.experts:
            return t
        experts = tuple("disk" if e in ON_DISK else "ram" for e in range(N_EXPERT))
        return dataclasses.replace(t, tier="disk", experts=experts)

    return dataclasses.replace(plan, tensors=tuple(map(with_disk, plan.tensors)))


def _decode(llm):
    llm.reset()
    out = []
    for t in llm.tokenize(TEXT):
        llm.eval([t])
        out.append(np.array(llm.scores[llm.n_tokens - 1], copy=True))
    return np.array(out)


@pytest.fixture(scope="module")
def reference(tiny_qwen3moe):
    trace = RoutingTrace(N_EXPERT, K)
    llm = hypura.Llama(str(tiny_qwen3moe), n_ctx=256, logits_all=True, n_threads=1, verbose=False,
                       on_route=trace.record, param_overrides={"model_params": {"use_extra_bufts": False}})
    try:
        return _decode(llm), trace
    finally:
        llm.close()


class _RecordingFiles(FileFiller):
    """Notes every byte range the pager reads at load (its load-time reader is a FileFiller)."""

    ranges: list = []

    def read(self, info, sink):
        _RecordingFiles.ranges.append((info.file_offset, info.file_offset + info.nbytes))
        super().read(info, sink)


def _disk_expert_ranges(pager):
    return [(s.info.file_offset + e * s.expert_bytes, s.info.file_offset + (e + 1) * s.expert_bytes)
            for layer, stacks in pager.stacks.items() for s in stacks for e in pager.on_disk[layer]]


@pytest.mark.parametrize("huge, fault_in_threads", [(False, 0), (True, 0), (False, 2)],
                         ids=["small pages", "huge pages inside experts", "fault-in threads"])
def test_disk_experts_are_read_when_selected_and_logits_do_not_change(tiny_qwen3moe, reference, monkeypatch, huge,
                                                                       fault_in_threads):
    want, trace = reference
    prefetch = "0"
    if huge:  # the large-expert path (Mixtral's 40 MB slices) on tiny experts
        monkeypatch.setattr(expert_paging, "HUGE_SLICE_BYTES", 0)
    monkeypatch.setattr(expert_paging, "fault_in_threads", lambda: fault_in_threads)
    monkeypatch.setattr(expert_paging, "FileFiller", _RecordingFiles)
    monkeypatch.setattr(expert_paging, "RSS_MARGIN", 1 << 50)  # the plan's share only: this test's budget is RAM
    _RecordingFiles.ranges = []
    overrides = {"model_params": {"use_extra_bufts": False}}
    llm = hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), n_ctx=256, logits_all=True, n_threads=1,
                       verbose=False, param_overrides=overrides)
    try:
        assert overrides == {"model_params": {"use_extra_bufts": False}}  # the plan's params stay ours
        assert llm._pager is not None and set(llm._pager.on_disk) == set(LAYERS)
        # loading read the RAM experts only: no read touched a disk expert's bytes
        at_load = list(_RecordingFiles.ranges)
        assert at_load and not any(lo < b and a < hi for lo, hi in at_load for a, b in _disk_expert_ranges(llm._pager))
        assert llm._pager.stats.reads == 0
        got = _decode(llm)
        assert np.array_equal(got, want)
        layer_bytes = {layer: sum(s.expert_bytes for s in stacks) for layer, stacks in llm._pager.stacks.items()}
        read_bytes = sum(n * layer_bytes[layer] for layer, n in llm._pager.stats.by_layer.items())
        paging = llm.stats(reset=True)["expert_paging"]
        assert llm.stats()["expert_paging"]["accesses"] == 0  # a bench's warm-up is not counted
    finally:
        llm.close()
    # against the routing trace: every selection is an access (a tie plan's RAM experts are the pager's too, as its
    # disk ones); one that was resident when its token came is a hit
    accesses = sum(len(row) for layer in LAYERS for row in trace.selections(layer))
    assert paging["accesses"] == accesses > 0
    # an access is a hit (resident from an earlier token), served by a prefetch, or read on demand
    pf = paging["prefetch"]
    demand = accesses - paging["hits"] - pf["used"]
    assert 0 < demand and paging["reads"] == demand + pf["issued"]
    on = prefetch != "0"
    assert (pf["issued"] > 0 and 0 < pf["used"] <= pf["issued"]) if on else pf["issued"] == 0
    assert pf["precision"] == (pf["used"] / pf["issued"] if on else 0.0) and pf["recall"] == pf["used"] / accesses
    assert paging["bytes"] == read_bytes  # whole experts of all three stacked tensors, nothing else
    assert paging["read_gbps_in_stall"] > 0  # demand reads were waited for
    assert paging["evictions"] > 0  # room is made before a slice faults in: RSS never holds more than the budget
    assert paging["resident"] <= paging["resident_peak"] <= paging["budget"]
    # every selection is served once, from the tier it was in: read on demand from disk, or found resident (from
    # the load, or read before)
    selections = sum(len(row) for layer in LAYERS for row in trace.selections(layer))
    assert paging["served"] == {"ram": selections - demand, "disk": demand}


def _page_disk_experts(pager) -> None:
    """Routing that moves to the disk experts: every layer selects them all, K a call, in the router's place."""
    disk = sorted(ON_DISK)
    for layer in LAYERS:
        for i in range(0, len(disk), K):
            pager.page_in(layer, np.array([disk[i:i + K]]))


def test_a_tie_plans_ram_experts_are_evicted_and_read_again(tiny_qwen3moe, reference, monkeypatch):
    """A CPU plan without recorded routing: its RAM experts start in the pager's LRU. Routing that moves to the disk
    experts evicts them (their pages leave); selected again, they are read back, and the logits stay bitwise."""
    monkeypatch.setattr(expert_paging, "RSS_MARGIN", 1 << 50)  # the budget stays the one set below
    want, _ = reference
    llm = hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), n_ctx=256, logits_all=True, n_threads=1,
                       verbose=False, param_overrides={"model_params": {"use_extra_bufts": False}})
    try:
        pager = llm._pager
        ram = [(layer, e) for layer in LAYERS for e in range(N_EXPERT) if e not in ON_DISK]
        assert pager.evict_ram and list(pager.resident) == ram  # from the load, oldest first
        assert pager.summary()["ram_in_lru_bytes"] == pager.resident_bytes > 0
        pager.budget = pager.base_budget = pager.resident_bytes  # room for as many experts as the plan keeps in RAM
        _page_disk_experts(pager)
        assert not set(ram) & set(pager.resident) and pager.stats.evictions == len(ram)
        if sys.platform.startswith("linux"):
            assert all(_own_pages(pager, *key) == 0 for key in ram)
        reads, (layer, e) = pager.stats.loads, ram[0]
        pager.page_in(layer, np.array([[e]]))
        assert pager.stats.loads == reads + 1 and next(reversed(pager.resident)) == (layer, e)
        assert np.array_equal(_decode(llm), want)  # RAM experts read back hold their weights
        assert pager.stats.loads > reads + 1  # the decode read more of them back
    finally:
        llm.close()


def test_ram_experts_stay_fixed_with_recorded_routing_or_a_gpu(tiny_qwen3moe, monkeypatch):
    """Only a CPU plan's tie is evictable: a plan from recorded routing keeps its RAM experts out of the LRU, and
    one with GPU tensors runs as it did."""
    from hypura.runtime.plan_policy import ram_experts_evictable

    plan = _plan(tiny_qwen3moe)
    on_gpu = tuple(dataclasses.replace(t, tier="gpu", compute="gpu") if not t.experts and t.layer == 0 else t
                   for t in plan.tensors)
    assert ram_experts_evictable(plan) and not ram_experts_evictable(dataclasses.replace(plan, tensors=on_gpu))
    assert not ram_experts_evictable(dataclasses.replace(plan, routing_tokens=64))
    monkeypatch.setattr(expert_paging, "RSS_MARGIN", 1 << 50)
    llm = hypura.Llama(str(tiny_qwen3moe), plan=dataclasses.replace(plan, routing_tokens=64), n_ctx=256,
                       n_threads=1, verbose=False)
    try:
        pager = llm._pager
        assert not pager.evict_ram and not pager.resident and pager.managed == pager.on_disk
        pager.budget = pager.base_budget
        _page_disk_experts(pager)
        assert all(layer_e[1] in ON_DISK for layer_e in pager.resident) and pager.stats.accesses == len(ON_DISK) * 2
    finally:
        llm.close()


def test_a_failed_expert_read_surfaces_as_an_error(tiny_qwen3moe, monkeypatch):
    llm = hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), n_ctx=256, n_threads=1, verbose=False)

    def failing(self, start, want):
        raise DiskReadError(f"{self.path}: injected read error")

    try:
        monkeypatch.setattr(DirectReader, "stage", failing)  # loaded already: only the pager's reads fail
        with pytest.raises(HypuraError, match="injected read error"):
            llm.eval(llm.tokenize(b"Hello"))
    finally:
        llm.close()


def _own_pages(pager, layer: int, e: int) -> int:
    """Pages of expert e's slices (those wholly inside them) the process holds as its own: present and mapped
    exclusively (/proc/self/pagemap bits 63 and 56), so not the shared zero page a read of an empty slice maps."""
    pages = 0
    with open("/proc/self/pagemap", "rb") as f:
        for stack in pager.stacks[layer]:
            base = int(ffi.cast("uintptr_t", lib().ggml_get_data(stack.tensor))) + e * stack.expert_bytes
            lo, hi = expert_paging.inner_blocks(base, stack.expert_bytes, 4096)
            for page in range(lo // 4096, hi // 4096):
                f.seek(page * 8)
                entry = int.from_bytes(f.read(8), "little")
                pages += (entry >> 63) & (entry >> 56) & 1
    return pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise, /proc/self/pagemap")
def test_experts_whose_reads_failed_leave_no_pages(tiny_qwen3moe, monkeypatch):
    """A call whose reads failed after others landed had faulted those slices in: none stays in the process
    unaccounted (not resident for the pager, so never evicted), whichever experts the failed calls selected."""
    monkeypatch.setattr(expert_paging, "fault_in_threads", lambda: 0)
    llm = hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), n_ctx=256, n_threads=1, verbose=False)
    stage, pager = DirectReader.stage, llm._pager
    up = [(s.info.file_offset, s.info.file_offset + s.info.nbytes) for stacks in pager.stacks.values()
          for s in stacks if "ffn_up" in s.info.name]

    def failing_up(self, start, want):  # the up projections' slices fail, late: down's and gate's land first
        if any(lo <= start < hi for lo, hi in up):
            time.sleep(0.05)
            raise DiskReadError(f"{self.path}: injected read error")
        return stage(self, start, want)

    try:
        llm.eval(llm.tokenize(b"Hello"))
        assert pager.resident and all(_own_pages(pager, *key) for key in pager.resident)  # what is measured
        disk = [(layer, e) for layer, experts in pager.on_disk.items() for e in experts]
        # memory an earlier model freed may come back to this one's stacks with its pages
        before = {key: _own_pages(pager, *key) for key in disk}
        monkeypatch.setattr(DirectReader, "stage", failing_up)
        for text in (b"The quick brown fox", b"jumps over the lazy dog"):
            with pytest.raises(HypuraError, match="injected read error"):
                llm.eval(llm.tokenize(text))
        stray = {key: n for key in disk if key not in pager.resident and (n := _own_pages(pager, *key)) > before[key]}
        assert stray == {}
    finally:
        llm.close()


def test_the_budget_grows_into_what_the_ram_budget_leaves(tiny_qwen3moe):
    import psutil

    llm = hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), n_ctx=256, n_threads=1, verbose=False)
    try:
        pager = llm._pager
        pager.ram_budget = psutil.Process().memory_info().rss + expert_paging.RSS_MARGIN + (64 << 20)
        pager._resize()
        assert pager.budget >= pager.base_budget + (32 << 20)  # ~64 MiB of slack, less what RSS grew meanwhile
        pager.ram_budget = 0  # no slack: back to the plan's share
        pager._resize()
        assert pager.budget == pager.base_budget
    finally:
        llm.close()


def test_an_expert_cache_with_experts_on_disk_is_refused(tiny_qwen3moe):
    with pytest.raises(HypuraError, match="experts on disk"):
        hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), expert_cache=4, n_ctx=256, verbose=False)


def test_op_offload_is_off_beside_paged_experts_with_a_gpu(tiny_qwen3moe, monkeypatch):
    """llama.cpp offloads a prompt's ops on host weights to the GPU, even at -ngl 0 (a plan without GPU
    tensors), copying each weight when its graph split starts: before the router hook has read the
    selected experts. On the H200 such a plan gave NaN logits in some runs."""
    import hypura.profile.devices

    monkeypatch.setattr(hypura.profile.devices, "has_gpu", lambda: True)  # the machine the decision sees
    llm = hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), n_ctx=256, n_threads=1, verbose=False)
    try:
        assert not any(t.tier == "gpu" for t in llm.plan.tensors) and llm._pager is not None
        assert llm.context_params.op_offload is False
    finally:
        llm.close()


def test_recorded_routing_is_saved_at_exit_for_a_llama_never_closed(tiny_qwen3moe, tmp_path):
    script = (f"import hypura\nllm = hypura.Llama({str(tiny_qwen3moe)!r}, n_ctx=64, n_threads=1, verbose=False, "
              f"on_route=lambda layer, ids: None)\nllm.eval([1, 2, 3])\n")
    env = {**os.environ, "HYPURA_ROUTING_DIR": str(tmp_path / "routing")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr  # saving at interpreter teardown failed before
    assert len(list((tmp_path / "routing").glob("*.npz"))) == 1


def test_recorded_routing_persists_and_an_unwritable_cache_only_warns(tiny_qwen3moe, tmp_path, monkeypatch):
    from hypura.runtime.moe.coactivation import CoactivationPredictor, model_key

    # logits for every token: otherwise llama.cpp's last layer computes (and routes) the last token only
    llm = hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), n_ctx=256, n_threads=1, verbose=False,
                       logits_all=True)
    tokens = llm.tokenize(TEXT)
    llm.eval(tokens)
    llm.close()
    saved = CoactivationPredictor.load(model_key(llm.header), len(LAYERS), N_EXPERT)
    assert saved.counts.sum() == len(tokens) * K * K  # each token: k experts at layer 0 x k at layer 1
    assert saved.tokens(K).tolist() == [len(tokens)] * len(LAYERS)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("HYPURA_ROUTING_DIR", str(tmp_path / "a-file" / "routing"))
    llm = hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), n_ctx=256, n_threads=1, verbose=False,
                       logits_all=True)
    llm.eval(tokens)
    with pytest.warns(UserWarning, match="recorded routing not saved"):
        llm.close()


def test_bench_bounds_paged_experts_at_the_measured_hit_rate(tiny_qwen3moe):
    """Which experts a decode reads from disk depends on routing: the bound takes the measured disk bytes
    per token, not the plan's prediction (#5: "the plan's bound at the measured hit rate")."""
    from hypura.speed.bound import bound
    from hypura.speed.single import BenchSettings, run_bench

    plan = _plan(tiny_qwen3moe)
    llm = hypura.Llama(str(tiny_qwen3moe), plan=plan, n_ctx=256, n_threads=1, verbose=False)
    try:
        out = run_bench(llm.loaded, plan, BenchSettings(0, 8, 1, 1))
    finally:
        llm.close()
    measured = out["stats"]["decode"]["streamed_bytes_per_token"]["disk"]
    assert 0 < measured and out["bound"] == bound(llm.header, plan, None, 1, disk_bytes=measured)
    at_measured = plan.rates.disk_seconds(measured, measured)  # every byte an expert's
    assert out["bound"]["step_seconds"]["disk"] == at_measured
    assert bound(llm.header, plan, None, 1)["step_seconds"]["disk"] != at_measured  # uniform routing: other bytes


def test_huge_pages_stay_inside_one_experts_slice():
    from hypura.runtime.moe.expert_paging import inner_blocks

    huge, expert = 2 << 20, 40370176  # a mixtral-8x7b Q5_K_M expert's slice of one stacked tensor
    for base in (0, 32, 4096 + 64, (2 << 20) - 32):
        for e in range(8):
            start = base + e * expert
            lo, hi = inner_blocks(start, expert, huge)
            assert start <= lo < hi <= start + expert and lo % huge == hi % huge == 0
            assert (hi - lo) // huge >= 17  # all but the two edge blocks
    lo, hi = inner_blocks(4096 + 32, 884736, huge)
    assert hi <= lo  # a qwen3-30b-a3b expert's slice holds no whole huge page
    assert inner_blocks(10, 8192, 4096) == (4096, 8192)


def test_fault_in_threads_need_spare_cores(monkeypatch):
    for cores, threads in [(2, 0), (4, 0), (8, 2), (16, 4), (128, 4)]:
        monkeypatch.setattr(expert_paging.os, "cpu_count", lambda: cores)
        assert expert_paging.fault_in_threads() == threads


def test_llama_threads_leave_spare_cores_to_the_pager():
    for physical, paged, threads in [(2, True, 2), (4, True, 4), (8, True, 6), (16, True, 12), (16, False, 16)]:
        assert llama_threads(physical, paged) == threads
    # a small machine whose decode waits on dense layers read from disk leaves a core to the reader
    for physical, threads in [(1, 1), (2, 1), (4, 3), (8, 8)]:
        assert llama_threads(physical, False, waits_on_disk_layers=True) == threads


def test_a_paged_plan_runs_fewer_threads_unless_told_and_other_defaults_stay(tiny_qwen3moe, monkeypatch):
    monkeypatch.setattr(host, "cores", lambda: (16, 16))
    for kwargs, threads in [({"plan": _plan(tiny_qwen3moe)}, (12, 12)), ({}, (16, 16)),
                            ({"plan": _plan(tiny_qwen3moe), "n_threads": 3}, (3, 3)),
                            ({"plan": _plan(tiny_qwen3moe), "n_threads_batch": 5}, (12, 5)),
                            ({"n_threads": 3}, (3, multiprocessing.cpu_count()))]:  # llama-cpp-python's default
        llm = hypura.Llama(str(tiny_qwen3moe), n_ctx=64, verbose=False, **kwargs)
        try:
            assert (llm.n_threads, llm.n_threads_batch) == threads
            assert (llm.context_params.n_threads, llm.context_params.n_threads_batch) == threads
        finally:
            llm.close()


def test_bench_probes_the_disk_with_decodes_reads_and_bounds_at_that_rate(tiny_qwen3moe):
    """A disk's O_DIRECT rate drifts over minutes (runtime/moe/disk_probe.py): the bench probes it with the plan's
    own expert reads before and after the runs, and gives the bound again at the mean rate; the probe leaves the
    logits and RSS alone."""
    from hypura.speed.bound import bound
    from hypura.speed.single import BenchSettings, run_bench
    from hypura.speed.report import report

    plan = _plan(tiny_qwen3moe)
    llm = hypura.Llama(str(tiny_qwen3moe), plan=plan, n_ctx=256, n_threads=1, verbose=False)
    try:
        out = run_bench(llm.loaded, plan, BenchSettings(0, 8, 1, 1))
        resident = llm._pager.resident_bytes
        probe = llm.probe_disk(0.05)
        assert llm._pager.resident_bytes == resident  # scratch reads: nothing paged in
    finally:
        llm.close()
    expert_bytes = [sum(t.nbytes // N_EXPERT for t in plan.tensors if t.experts and t.layer == layer)
                    for layer in LAYERS]
    experts = probe["bursts"] * probe["experts_per_burst"]  # each burst: that many experts of one layer, all stacks
    assert experts * min(expert_bytes) <= probe["bytes"] <= experts * max(expert_bytes) and probe["gbps"] > 0
    before, after = out["disk_probe"]["before"], out["disk_probe"]["after"]
    assert before["seconds"] >= 1.0 and before["bytes"] > 0 and after["gbps"] > 0
    measured = out["stats"]["decode"]["streamed_bytes_per_token"]["disk"]
    rate = (before["gbps"] + after["gbps"]) / 2 * 1e9
    assert out["bound_now"] == bound(llm.header, plan, None, 1, disk_bytes=measured, disk_rate=rate)
    assert out["bound"] == bound(llm.header, plan, None, 1, disk_bytes=measured)  # the profile's bound beside it
    assert any("as probed beside the runs" in line for line in report(out))


def test_a_plan_without_disk_experts_is_not_probed(tiny_qwen3moe):
    from hypura.speed.single import BenchSettings, run_bench

    llm = hypura.Llama(str(tiny_qwen3moe), n_ctx=256, n_threads=1, verbose=False)
    try:
        assert llm.probe_disk() is None
        assert "disk_probe" not in run_bench(llm.loaded, None, BenchSettings(0, 4, 1, 1))
    finally:
        llm.close()


def test_each_probe_reads_other_experts(tiny_qwen3moe, monkeypatch):
    """The probes before and after a bench's runs must not read the same ranges: a cache under O_DIRECT (a
    virtual disk's host) would serve the second (the H200, 2026-12-03: "after" read 1-28% faster each time)."""
    read = []

    def recording(reads, next_burst, seconds):
        read.append([(part.file_offset, part.file_offset + part.nbytes) for _ in range(8) for part in next_burst()])
        return {"gbps": 1.0, "bytes": 0, "seconds": seconds, "bursts": 8}

    monkeypatch.setattr(expert_paging, "burst_rate", recording)
    llm = hypura.Llama(str(tiny_qwen3moe), plan=_plan(tiny_qwen3moe), n_ctx=256, n_threads=1, verbose=False)
    try:
        llm.probe_disk(0.0), llm.probe_disk(0.0)
        disk = set(_disk_expert_ranges(llm._pager))
    finally:
        llm.close()
    assert read[0] != read[1] and set(read[0]) | set(read[1]) <= disk  # disk experts only, others each time


def test_a_prompt_of_several_micro_batches_pages_its_experts(tiny_qwen3moe):
    """A batch larger than the micro-batch (llama.cpp splits it) runs with experts paged from disk: between its
    micro-batches the router hook may see a graph of no tokens, which routes nothing."""
    from hypura.speed.single import BenchSettings, run_bench

    plan = _plan(tiny_qwen3moe)
    llm = hypura.Llama(str(tiny_qwen3moe), plan=plan, n_ctx=1024, n_batch=1024, n_ubatch=256, n_threads=1,
                       verbose=False)
    try:
        out = run_bench(llm.loaded, plan, BenchSettings(1000, 0, 1, 1))
    finally:
        llm.close()
    assert out["stats"]["prefill"]["tokens"] >= 1000
