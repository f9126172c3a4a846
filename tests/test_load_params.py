"""llama.cpp's parameters and threads from the decision (hypura/plan/load_params.py): pinned plans and machines in,
the fields the load applies out; what the user gave stands."""

from __future__ import annotations

import llama_cpp
import pytest

import hypura  # noqa: F401  first: our library
from hypura.plan.ask import Ask
from hypura.plan.cost import Prediction, Rates, Traffic
from hypura.plan.load_params import Host, load_params
from hypura.plan.plan import Plan, TensorPlacement
from hypura.tiers.names import CPU, DISK, GPU, RAM

CPU_VM = Host(gpu=False, cores=2, cpus=2)
GPU_HOST = Host(gpu=True, cores=16, cpus=32)
MiB = 1 << 20


def plan(*tensors: TensorPlacement, kv_tier: str = RAM, n_ubatch: int = 512, expert_slots: int = 0,
         op_offload: bool = True, host_pinned: bool = False, decode_limit: str = "cpu",
         prefill_limit: str = "compute", seconds: dict | None = None) -> Plan:
    """A plan of two blocks placed as `tensors` say (no solver: every figure the parameters read is pinned)."""
    return Plan(model="m.gguf", arch="llama", n_layer=2, n_ctx=4096, n_ubatch=n_ubatch, mode="mixed",
                solver="optimizer", config="", tensors=tensors, kv_tier=kv_tier, kv_bytes=0, pool_slots=0,
                pool_slot_bytes=0, staging_slots=0, staging_slot_bytes=0, prefetch_depth=1, expert_cache={},
                memory={}, unified=False, traffic=Traffic(op_offload=op_offload, host_pinned=host_pinned),
                prediction=Prediction(1.0, decode_limit, 100.0, prefill_limit, seconds or {}),
                rates=Rates(cpu_read=50e9, disk_read=2e9), expert_slots=expert_slots)


def t(name: str, tier: str, compute: str, layer: int = 0, experts: tuple = ()) -> TensorPlacement:
    return TensorPlacement(name, tier, compute, 8 * MiB, layer, experts, tuple(compute for _ in experts))


def fields(p) -> dict:
    f = p.fields()
    return {**f["model_params"], **f["context_params"]}


def test_llamas_placement_sets_nothing_but_the_context_batches_and_threads():
    p = load_params(None, 0, Ask(n_gpu_layers=5, n_ubatch=256, n_batch=1024), CPU_VM)
    assert fields(p) == {} and not p.needed  # -ngl 5: llama.cpp's placement, as given
    assert (p.n_ctx, p.n_ubatch, p.n_batch) == (0, 256, 1024)
    assert (p.n_threads, p.n_threads_batch) == (2, 2)  # llama.cpp's default: the physical cores


def test_a_gpu_plan_puts_every_layers_work_on_the_gpu_and_the_kv_cache_where_planned():
    resident = plan(t("blk.0.attn_q.weight", GPU, GPU), t("blk.1.ffn_up.weight", RAM, CPU, 1), kv_tier=GPU)
    p = load_params(resident, 4096, Ask(), GPU_HOST)
    # n_layer + 1: the output layer too; CPU weights in plain memory as the profile measured them
    assert fields(p) == {"n_gpu_layers": 3, "offload_kqv": True, "no_host": True}
    assert set(p.needed) == {"n_gpu_layers", "offload_kqv", "no_host"}
    kv_in_ram = plan(t("blk.0.attn_q.weight", GPU, GPU), kv_tier=RAM)
    assert load_params(kv_in_ram, 4096, Ask(), GPU_HOST).offload_kqv is False


def test_a_cpu_plan_keeps_llamas_cpu_and_turns_the_gpu_off():
    p = load_params(plan(t("blk.0.attn_q.weight", RAM, CPU)), 4096, Ask(), CPU_VM)
    assert fields(p) == {"n_gpu_layers": 0, "offload_kqv": False}


def test_disk_layers_streamed_through_the_host_pool_take_op_offload_and_repacking_off():
    streamed = plan(t("blk.0.attn_q.weight", GPU, GPU), t("blk.1.ffn_up.weight", DISK, CPU, 1))
    p = load_params(streamed, 4096, Ask(), GPU_HOST)
    assert p.op_offload is False and p.use_extra_bufts is False
    assert p.needed["op_offload"] == "host weights filled by hooks"
    # without a GPU there is no op offload to turn off; the repacking buffers still go
    cpu = load_params(plan(t("blk.1.ffn_up.weight", DISK, CPU, 1)), 4096, Ask(), CPU_VM)
    assert cpu.op_offload is None and cpu.use_extra_bufts is False


def test_experts_paged_from_disk_want_plain_unpinned_buffers_and_spare_cores():
    paged = plan(t("blk.0.ffn_up_exps.weight", DISK, CPU, experts=(RAM, DISK)))
    host = Host(gpu=False, cores=16, cpus=32)
    p = load_params(paged, 4096, Ask(), host)
    assert (p.use_extra_bufts, p.no_host) == (False, True) and p.needed["no_host"] == "experts paged from disk"
    assert (p.n_threads, p.n_threads_batch) == (12, 12)  # a quarter of the cores left to the pager's reads
    assert (load_params(paged, 4096, Ask(n_threads=3), host).n_threads_batch) == 3
    assert load_params(paged, 4096, Ask(n_threads_batch=5), host).n_threads_batch == 5


def test_a_plan_made_without_op_offload_turns_it_off_unless_the_caller_set_it():
    off = plan(t("blk.0.attn_q.weight", GPU, GPU), op_offload=False, host_pinned=True)
    p = load_params(off, 4096, Ask(), GPU_HOST)
    assert p.op_offload is False and "op_offload" not in p.needed
    # pinned CPU weights, in ggml's plain layout, homed in the mapped file: never in cudaHostAlloc'd buffers
    assert p.use_extra_bufts is False and p.no_host is True
    given = Ask(param_overrides={"context_params": {"op_offload": True}})
    assert load_params(off, 4096, given, GPU_HOST).op_offload is None  # the caller's stands


def test_the_plans_micro_batch_unless_the_user_gave_one():
    big = plan(t("blk.0.attn_q.weight", GPU, GPU), n_ubatch=2048)
    p = load_params(big, 4096, Ask(), GPU_HOST)
    assert (p.n_ubatch, p.n_batch) == (2048, 2048)
    assert fields(p)["n_ubatch"] == 2048 and fields(p)["n_batch"] == 2048  # over the caller's context fields too
    assert load_params(big, 4096, Ask(n_batch=8192), GPU_HOST).n_batch == 8192  # a batch at least as large
    user = load_params(big, 4096, Ask(n_ubatch=256, n_batch=1024), GPU_HOST)  # -ub 256 -b 1024
    assert (user.n_ubatch, user.n_batch) == (256, 1024) and "n_ubatch" not in fields(user)


def test_threads_the_user_gave_stand():
    slow_disk = plan(t("blk.1.ffn_up.weight", DISK, CPU, 1), decode_limit="disk",
                     seconds={"cpu": 0.1, "disk": 1.0})
    p = load_params(slow_disk, 4096, Ask(), CPU_VM)
    # a 2-core machine whose decode waits on dense layers read from disk leaves a core to the reader; a prompt's
    # micro-batch the plan predicts compute-bound takes it back
    assert (p.n_threads, p.n_threads_batch) == (1, 2)
    assert (load_params(slow_disk, 4096, Ask(n_threads=2, n_threads_batch=1), CPU_VM).n_threads,
            load_params(slow_disk, 4096, Ask(n_threads=2, n_threads_batch=1), CPU_VM).n_threads_batch) == (2, 1)
    # -t alone: the batch's is llama-cpp-python's default, all logical CPUs
    one = load_params(None, 0, Ask(n_threads=1), GPU_HOST)
    assert (one.n_threads, one.n_threads_batch) == (1, 32)


def test_parallel_sequences_share_one_unified_kv_cache_with_the_spare_ids():
    p = load_params(None, 4 * 4096, Ask(parallel=4, spare_seqs=1, n_threads=1), GPU_HOST)
    assert fields(p) == {"n_seq_max": 5, "kv_unified": True}
    assert p.n_threads_batch == 1  # llama-server's -tb default: -t, for steps of several sequences
    assert load_params(None, 0, Ask(parallel=4, spare_seqs=1, n_threads=1, n_threads_batch=2),
                       GPU_HOST).n_threads_batch == 2
    # a split KV cache gives each sequence id its own cells: no spare there; what the caller set stands
    split = load_params(None, 0, Ask(parallel=4, spare_seqs=1, param_overrides={
        "context_params": {"kv_unified": False}}), GPU_HOST)
    assert fields(split) == {"n_seq_max": 4}
    tree = load_params(None, 0, Ask(parallel=4, param_overrides={"context_params": {"n_seq_max": 8}}), GPU_HOST)
    assert fields(tree) == {"kv_unified": True}
    assert fields(load_params(None, 0, Ask(), GPU_HOST)) == {}  # one sequence: llama-cpp-python's context


@pytest.mark.parametrize("machine, expected", [
    (GPU_HOST, {"n_gpu_layers": -1, "load_mode": llama_cpp.LLAMA_LOAD_MODE_NONE}),
    (CPU_VM, {"use_extra_bufts": False})])
def test_an_expert_cache_reads_its_experts_into_plain_buffers(machine, expected):
    assert fields(load_params(None, 0, Ask(expert_cache=True), machine)) == expected
    # with a GPU, preferences: the caller's -ngl and load mode stand
    given = Ask(expert_cache=True, param_overrides={"model_params": {"n_gpu_layers": 10, "load_mode": 0}})
    assert fields(load_params(None, 0, given, GPU_HOST)) == {}


def test_a_user_value_that_contradicts_the_plan_is_refused_where_it_is_applied(tiny_llama):
    """The decision says why a field is needed; the runtime refuses a caller's value against it."""
    from hypura.errors import HypuraError
    from hypura.modelfile import read_header
    from hypura.plan.decision import decide
    from hypura.profile import resolve_profile
    from hypura.runtime.runtime import Runtime

    header = read_header(tiny_llama)
    ask = Ask(gpu_mem=0, ram="2GiB", n_ctx=256, param_overrides={"model_params": {"n_gpu_layers": 7}})
    d = decide(header, ask, None, resolve_profile("h200-design"), host=CPU_VM)
    assert d.params.n_gpu_layers == 0 and d.params.needed["n_gpu_layers"] == "the plan's placement"
    with pytest.raises(HypuraError, match=r"n_gpu_layers=7 contradicts the plan, which needs 0"):
        Runtime(header, str(tiny_llama), d)
