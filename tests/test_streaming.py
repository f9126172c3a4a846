"""Layer streaming on the CPU: disk-tier layers go through host-pool slots, read by the loader thread
each time they are needed, and the logits stay bitwise those of llama.cpp's own placement with repacking off:
the same as its default for SmolLM2-135M (Q4_1, Q8_0: nothing repacked), not for K-quants on CPUs that repack."""

import contextlib
import dataclasses
import errno
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hypura
from hypura.errors import HypuraError
from hypura.plan import PlanSettings, plan_model
from hypura.profile import machine_profile
from hypura.tiers.direct_io import DiskReadError
from hypura.runtime.placement import Tier
from hypura.runtime.transfers import Transfers

import llama_cpp
from conftest import PLAN_PROMPT

N_LAYER = 30  # SmolLM2-135M
ALL = range(N_LAYER)


@pytest.fixture(scope="module")
def reference(smollm2_path, n_threads, prompt_logits):
    llm = llama_cpp.Llama(str(smollm2_path), n_ctx=256, logits_all=True, n_threads=n_threads, verbose=False)
    try:
        return prompt_logits(llm)
    finally:
        llm.close()  # at once: it maps the model file, which test_the_model_file_is_not_mapped must not see


@pytest.fixture(scope="module")
def ram_plan(smollm2_path):
    return plan_model(smollm2_path, machine_profile(), ram="4GiB", settings=PlanSettings(n_ctx=256))


def streamed(plan, layers, slots, depth=2):
    """`plan` with the blocks in `layers` on disk, streamed through `slots` host-pool slots."""
    tensors = tuple(dataclasses.replace(t, tier="disk") if t.layer in layers else t for t in plan.tensors)
    return dataclasses.replace(plan, tensors=tensors, staging_slots=slots, prefetch_depth=depth)


@contextlib.contextmanager
def opened(path, plan, n_threads):
    llm = hypura.Llama(str(path), plan=plan, n_ctx=256, logits_all=True, n_threads=n_threads, verbose=False)
    try:
        yield llm
    finally:
        llm.close()


@pytest.mark.slow
@pytest.mark.parametrize("layers,slots,depth", [(ALL, 1, 0), (ALL, 2, 1), (ALL, 3, 2), (ALL, 40, 2),
                                                (range(0, N_LAYER, 3), 2, 1)],
                         ids=["1-slot-no-prefetch", "2-slots-depth-1", "3-slots-depth-2", "a-slot-per-layer",
                              "every-third-layer"])
def test_streamed_logits_are_bitwise_equal(smollm2_path, ram_plan, reference, n_threads, layers, slots, depth,
                                           prompt_logits):
    plan = streamed(ram_plan, layers, slots, depth)
    n, disk_bytes = len(layers), sum(t.nbytes for t in plan.tensors if t.tier == "disk")
    with opened(smollm2_path, plan, n_threads) as llm:
        for t in plan.tensors:  # streamed layers take their slots round-robin, in graph order
            assert llm.placement[t.name].pool_slot == (layers.index(t.layer) % slots if t.tier == "disk" else -1)
            assert llm.placement[t.name].tier == Tier.HOST
        assert np.array_equal(prompt_logits(llm), reference)
        first = llm.stats()["stream"]
        assert np.array_equal(prompt_logits(llm), reference)  # slots reused or reloaded
        second = llm.stats()["stream"]
    # every layer loaded once from disk; with fewer slots than layers the next pass's first `depth`
    # layers are prefetched as the pass ends; only the very first layer is a demand load
    assert first["loads"] == n + (depth if slots < n else 0)
    assert first["demand_loads"] == (first["loads"] if depth == 0 else 1)
    assert set(first["bytes"]) == {"disk"} and first["bytes"]["disk"] >= disk_bytes
    # a layer still owning its slot is not read again; otherwise each is read once per pass
    assert second["loads"] - first["loads"] == (0 if slots >= n else n)
    assert second["bytes"]["disk"] - first["bytes"]["disk"] == (0 if slots >= n else disk_bytes)


DELAY_S = 0.002


def slow(fd, bufs, offset):
    time.sleep(DELAY_S)
    return os.preadv(fd, bufs, offset)


def trickle(fd, bufs, offset):  # at most 20 KiB (five O_DIRECT blocks) a call
    return os.preadv(fd, [bufs[0][: 20 << 10]], offset)


def short_every_other_call():
    calls = []

    def pread(fd, bufs, offset):
        calls.append(offset)
        return (trickle if len(calls) % 2 else os.preadv)(fd, bufs, offset)

    return pread


@pytest.mark.slow
def test_a_slot_is_used_only_once_its_load_completed(smollm2_path, ram_plan, reference, n_threads, monkeypatch,
                                                     prompt_logits):
    monkeypatch.setattr(Transfers, "pread", staticmethod(slow))  # loads lag behind compute
    plan = streamed(ram_plan, ALL, slots=2, depth=1)
    with opened(smollm2_path, plan, n_threads) as llm:
        assert np.array_equal(prompt_logits(llm), reference)
        assert np.array_equal(prompt_logits(llm), reference)
        stats = llm.stats()["stream"]
    # every load was waited for before its layer ran, except the one prefetched for the next pass
    assert stats["waits"] == stats["loads"] - 1
    # the demand load of layer 0 alone (one delayed read per tensor) was waited for this long
    assert stats["stall_s"] >= DELAY_S * sum(t.layer == 0 for t in plan.tensors)


@pytest.mark.slow
@pytest.mark.parametrize("pread", [
    pytest.param(short_every_other_call(), id="short-then-full"),
    pytest.param(trickle, id="always-20KiB"),
])
def test_short_reads_are_completed_before_use(smollm2_path, ram_plan, reference, n_threads, monkeypatch, pread,
                                              prompt_logits):
    monkeypatch.setattr(Transfers, "pread", staticmethod(pread))
    with opened(smollm2_path, streamed(ram_plan, ALL, slots=2, depth=1), n_threads) as llm:
        assert np.array_equal(prompt_logits(llm), reference)
        assert np.array_equal(prompt_logits(llm), reference)


def eio(fd, bufs, offset):
    raise OSError(errno.EIO, "Input/output error")


def eio_keeping_no_buffer(fd, bufs, offset):
    del bufs  # the traceback of the error then holds no view of the reader's buffer
    raise OSError(errno.EIO, "Input/output error")


@pytest.mark.slow
@pytest.mark.parametrize("pread", [
    eio,
    eio_keeping_no_buffer,
])
def test_a_failed_read_voids_the_eval(smollm2_path, ram_plan, n_threads, monkeypatch, pread):
    with opened(smollm2_path, streamed(ram_plan, ALL, slots=2, depth=1), n_threads) as llm:
        # after the load: streamed layers are first read by the eval
        monkeypatch.setattr(Transfers, "pread", staticmethod(pread))
        with pytest.raises(HypuraError, match="could not be streamed.*after 3 retries: Input/output error") as info:
            llm.eval(llm.tokenize(PLAN_PROMPT))
    assert isinstance(info.value.__cause__, DiskReadError)


# Beyond resident weights, KV cache and slots: llama.cpp's compute and output buffers (n_ubatch 512,
# one row of logits), the loader's read buffer, allocator slack; ~25 MiB measured on x86-64 Linux.
OVERHEAD = 40 << 20

# run in a fresh interpreter: memory that earlier tests freed stays in this process and hides growth
_RSS_GROWTH = """
import sys, psutil
from hypura import Llama  # imports llama_cpp and numpy: before the first measurement
before = psutil.Process().memory_info().rss
llm = Llama(sys.argv[1], plan=sys.argv[2], n_ctx=256, n_threads=int(sys.argv[3]), verbose=False)
llm.eval(llm.tokenize(b"The page cache is not a hidden tier. " * 8))
print(psutil.Process().memory_info().rss - before)
llm.close()
"""


@pytest.mark.slow
def test_streaming_stays_within_its_ram_budget(smollm2_path, ram_plan, n_threads, tmp_path):
    plan = streamed(ram_plan, ALL, slots=2)
    resident = sum(t.nbytes for t in plan.tensors if t.tier != "disk")
    slot = max(sum(t.nbytes for t in plan.tensors if t.layer == layer) for layer in ALL)
    budget = resident + plan.staging_slots * slot + plan.kv_bytes + OVERHEAD
    assert budget < sum(t.nbytes for t in plan.tensors) + plan.kv_bytes  # holding every weight would not fit
    run = subprocess.run([sys.executable, "-c", _RSS_GROWTH, str(smollm2_path), str(plan.save(tmp_path / "p.json")),
                          str(n_threads)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout.split()[-1]) < budget


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_model_file_is_not_mapped(smollm2_path, ram_plan, n_threads, prompt_logits):
    model = os.path.realpath(smollm2_path)

    def mappings() -> set[str]:
        with open("/proc/self/maps") as f:
            return {line for line in f if line.rstrip().endswith(model)}

    before = mappings()  # another test's model, mapped and not yet collected, is not this load's
    with opened(smollm2_path, streamed(ram_plan, ALL, slots=2), n_threads) as llm:
        prompt_logits(llm)
        mapped = mappings() - before
    assert mapped == set()  # the page cache is not a hidden tier: no weight is read through a mapping


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_a_runtime_failing_part_way_closes_what_it_had_opened(smollm2_path, ram_plan, n_threads, monkeypatch):
    """A failure in the runtime's constructor after the mapping and the loader thread were made (here its last
    step, the stats) closes them before it is raised: no mapping, descriptor or thread of this model is left."""
    from hypura.runtime import runtime

    model = os.path.realpath(smollm2_path)

    def left() -> set:
        with open("/proc/self/maps") as f:
            maps = {line for line in f if line.rstrip().endswith(model)}
        fds = {fd for fd in os.listdir("/proc/self/fd") if _link(f"/proc/self/fd/{fd}") == model}
        return maps | fds | {t for t in threading.enumerate() if t.name.startswith("hypura-")}

    def injected(*args, **kwargs):
        raise RuntimeError("injected failure")

    before = left()
    monkeypatch.setattr(runtime, "homes_mapped", lambda *args: True)  # the mapping too, which a CPU plan lacks
    monkeypatch.setattr(runtime, "RunStats", injected)
    with pytest.raises(RuntimeError, match="injected failure"):
        hypura.Llama(str(smollm2_path), plan=streamed(ram_plan, ALL, slots=2), n_ctx=256, n_threads=n_threads,
                     verbose=False)
    assert left() <= before  # another test's model, collected meanwhile, may have gone


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed since it was listed
        return ""


def test_streamed_logits_equal_resident_without_repacking(tiny_llama, n_threads, prompt_logits):
    """Streaming through host-pool slots turns llama.cpp's weight repacking off (slots hold ggml's plain
    layout): the logits are bitwise those of resident llama.cpp with repacking off (`--no-repack`). Where
    llama.cpp repacks (Q4_K on x86 with AVX2 or AVX-512, ARM), its default resident load computes with
    other kernels, and its logits differ from these in the last bits (README, docs/design.md)."""
    plain = hypura.Llama(str(tiny_llama), n_ctx=256, logits_all=True, n_threads=n_threads, verbose=False,
                         fit=False, param_overrides={"model_params": {"use_extra_bufts": False}})
    try:
        want = prompt_logits(plain)
    finally:
        plain.close()
    plan = plan_model(tiny_llama, machine_profile(), ram="4GiB", settings=PlanSettings(n_ctx=256))
    with opened(tiny_llama, streamed(plan, range(plan.n_layer), slots=2), n_threads) as llm:
        assert all(llm.tensor_buffer(t.name) != "CPU_REPACK" for t in plan.tensors)
        assert np.array_equal(prompt_logits(llm), want)


def test_a_small_machine_waiting_on_disk_layers_leaves_a_core_to_the_reader(smollm2_path, ram_plan, monkeypatch):
    from hypura.profile import host

    monkeypatch.setattr(host, "cores", lambda: (2, 2))  # the machine the decision sees
    on_disk = streamed(ram_plan, ALL, slots=2)
    waits = dataclasses.replace(on_disk, prediction=dataclasses.replace(  # the disk 10x slower than the CPU
        on_disk.prediction, decode_limit="disk", seconds={"cpu": 0.01, "disk": 0.1}, prefill_limit="disk"))
    prefill_computes = dataclasses.replace(waits, prediction=dataclasses.replace(waits.prediction,
                                                                                  prefill_limit="compute"))
    computes = dataclasses.replace(waits, prediction=dataclasses.replace(  # one core would make the CPU the limit
        waits.prediction, seconds={"cpu": 0.06, "disk": 0.1}))
    for plan, threads in [(waits, (1, 1)), (prefill_computes, (1, 2)), (computes, (2, 2)), (ram_plan, (2, 2))]:
        llm = hypura.Llama(str(smollm2_path), plan=plan, n_ctx=256, verbose=False)
        try:
            assert (llm.n_threads, llm.n_threads_batch) == threads
        finally:
            llm.close()
