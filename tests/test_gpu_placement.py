"""Placement hooks on a CUDA build: tiers land where asked, defaults equal llama.cpp's own."""

import ctypes
import dataclasses
import mmap
import os
import subprocess
import sys

import numpy as np
import pytest

import hypura
from hypura.bindings.ffi import ffi, lib
from hypura.runtime.placement import Placement, Tier

import llama_cpp

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    if os.environ.get("HYPURA_GPU_TEST_MODEL"):  # a GPU machine without the default model's tokenizer
        return os.environ["HYPURA_GPU_TEST_MODEL"]
    path = tmp_path_factory.mktemp("gpu") / "tiny-qwen3moe.gguf"
    subprocess.run([sys.executable, "-m", "hypura.cli.main", "synth", "tiny-qwen3moe", str(path)], check=True)
    return path


def _buffers(model_ptr, names):
    address = ctypes.cast(model_ptr, ctypes.c_void_p).value
    model = ffi.cast("struct llama_model *", address)
    return {n: ffi.string(lib().hypura_model_tensor_buft(model, n.encode())).decode() for n in names}


def _logits(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], copy=True)


def test_default_policy_places_exactly_as_llama_cpp(moe_model):
    kwargs = dict(n_gpu_layers=2, n_ctx=256, logits_all=True, verbose=False)  # output + last block
    vanilla = llama_cpp.Llama(str(moe_model), **kwargs)
    ours = hypura.Llama(str(moe_model), **kwargs)
    names = [t.name for t in ours.header.tensors]
    assert _buffers(ours.model, names) == _buffers(vanilla.model, names)
    placed = set(_buffers(ours.model, names).values())
    assert any(b.startswith("CUDA") for b in placed) and any(b.startswith("CPU") for b in placed)
    tokens = vanilla.tokenize(b"The quick brown fox jumps over the lazy dog. " * 8)
    assert np.array_equal(_logits(ours, tokens), _logits(vanilla, tokens))


def test_override_experts_to_cpu(moe_model):
    llm = hypura.Llama(str(moe_model), n_gpu_layers=99, n_ctx=256, verbose=False, override_tensor="exps=CPU")
    names = [t.name for t in llm.header.tensors]
    for name, buft in _buffers(llm.model, names).items():
        if "_exps" in name:
            assert buft in ("CPU", "CPU_Mapped"), name  # mmap on: mapped from the file
        elif name.startswith("blk."):
            assert buft.startswith("CUDA") and "Host" not in buft, name


def test_explicit_tiers_and_deferred_gpu_tensors(moe_model):
    """GPU, pinned and host tiers as asked; deferred GPU tensors filled from Python compute
    the same logits as llama.cpp's own load of the same placement."""

    def tiers(info):
        if "ffn_down_exps" in info.name:
            return Placement(tier=Tier.PINNED)
        if "ffn_up_exps" in info.name:
            return Placement(tier=Tier.HOST)
        return Placement(tier=Tier.GPU, defer=info.layer == 1)

    kwargs = dict(n_gpu_layers=0, n_ctx=256, logits_all=True, verbose=False, use_mmap=False)
    llm = hypura.Llama(str(moe_model), placement_policy=tiers, **kwargs)
    names = [t.name for t in llm.header.tensors]
    bufs = _buffers(llm.model, names)
    assert bufs["blk.0.ffn_down_exps.weight"] == "CUDA_Host"
    assert bufs["blk.0.ffn_up_exps.weight"] in ("CPU", "CUDA_Host")  # HOST = llama.cpp's CPU override
    assert bufs["blk.1.attn_q.weight"].startswith("CUDA") and "Host" not in bufs["blk.1.attn_q.weight"]

    same_without_defer = hypura.Llama(
        str(moe_model), placement_policy=lambda i: Placement(tier=tiers(i).tier), **kwargs
    )
    tokens = llm.tokenize(b"Once upon a time, in a land far away, " * 8)
    assert np.array_equal(_logits(llm, tokens), _logits(same_without_defer, tokens))


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory):
    if os.environ.get("HYPURA_GPU_TEST_DENSE"):
        return os.environ["HYPURA_GPU_TEST_DENSE"]
    path = tmp_path_factory.mktemp("gpu") / "tiny-llama.gguf"
    subprocess.run([sys.executable, "-m", "hypura.cli.main", "synth", "tiny-llama", str(path)], check=True)
    return path


def _design_plan(model, placed, **fields):
    """The H200 design profile's plan, each tensor's placement rewritten by `placed` (the planner keeps
    these tiny models on the CPU, so callers say where tensors go), the KV cache on the GPU, other plan
    fields as given."""
    from hypura.plan import PlanSettings, plan_model
    from hypura.profile import resolve_profile

    plan = plan_model(model, resolve_profile("h200-design"), settings=PlanSettings(n_ctx=256))
    return dataclasses.replace(plan, tensors=tuple(map(placed, plan.tensors)), kv_tier="gpu", **fields)


def _all_streamed(model, tier, slots):
    """An all-GPU plan with every block tensor streamed through `slots` GPU slots from `tier`:
    the same kernels as resident weights, so the logits must not change by a bit."""

    def placed(t):
        if t.layer >= 0:
            return dataclasses.replace(t, tier=tier, compute="gpu")
        return dataclasses.replace(t, tier="gpu", compute="gpu") if t.name.startswith("output") else t

    return _design_plan(model, placed, pool_slots=slots)


@pytest.mark.parametrize("tier,slots", [("ram", 2), ("ram", 3), ("disk", 2), ("ram", 64)])
def test_streamed_gpu_layers_give_the_same_logits(dense_model, tier, slots):
    kwargs = dict(n_ctx=256, logits_all=True, verbose=False)
    resident = hypura.Llama(str(dense_model), n_gpu_layers=-1, **kwargs)
    tokens = resident.tokenize(b"The quick brown fox jumps over the lazy dog. " * 8)
    want = _logits(resident, tokens)
    decode_want = [_logits(resident, tokens[:n])[-1] for n in (1, 2)]
    resident.close()
    llm = hypura.Llama(str(dense_model), plan=_all_streamed(dense_model, tier, slots), **kwargs)
    try:
        pooled = {n: p for n, p in llm.placement.items() if p.pool_slot >= 0}
        assert pooled and all(p.tier == Tier.GPU for p in pooled.values())
        assert set(_buffers(llm.model, list(pooled)).values()) == {"CUDA0"}
        for _ in range(2):  # a second pass reuses slots (or finds the layers still there)
            assert np.array_equal(_logits(llm, tokens), want)
        for n, row in zip((1, 2), decode_want):  # batches of one and two tokens: the decode kernels
            assert np.array_equal(_logits(llm, tokens[:n])[-1], row)
        st = llm.stats()
        assert st["stream"]["loads"] > 0 and st["stream"]["bytes"].get(tier, 0) > 0
        # weights are copied to the GPU, so the CPU computes in pageable memory: its hand-offs to the GPU
        # would otherwise queue behind the weight copies (hook API v8)
        backends = {b for phase in ("prefill", "decode") for _, b, _ in st[phase]["last_call_splits_ms"]}
        assert "CPU" in backends and "CUDA_Host" not in backends
    finally:
        llm.close()


def _decode_logits(llm, tokens):
    llm.reset()
    out = []
    for t in tokens:
        llm.eval([t])
        out.append(np.array(llm.scores[llm.n_tokens - 1], copy=True))
    return np.array(out)


@pytest.mark.parametrize("per_token", [1, 1.5, 4])
def test_expert_caches_on_the_gpu_give_the_same_logits(moe_model, per_token):
    """Decode from GPU expert slots (loaded from pinned RAM on demand and ahead) against every expert
    resident on the GPU: the same CUDA kernels read the same bytes, so not a bit may change. Slots: a token's
    experts (k) times `per_token`, whatever model the test runs on."""
    from hypura.modelfile import read_header

    header = read_header(moe_model)
    k, moe_layers = int(header.get("expert_used_count")), int(header.get("block_count"))
    kwargs = dict(n_ctx=256, logits_all=True, verbose=False)
    resident = hypura.Llama(str(moe_model), n_gpu_layers=-1, **kwargs)
    tokens = resident.tokenize(b"The quick brown fox jumps over the lazy dog. " * 3)
    want = _decode_logits(resident, tokens)
    resident.close()
    llm = hypura.Llama(str(moe_model), expert_cache=int(k * per_token), **kwargs)
    try:
        assert llm.tensor_buffer("blk.0.ffn_up_exps.weight") == "CUDA_Host"
        assert np.array_equal(_decode_logits(llm, tokens), want)
        ex = llm.stats()["experts"]
        assert ex["accesses"] == len(tokens) * k * moe_layers  # every token, every layer, k experts each
        assert ex["hit_rate"].get("gpu", 0) > 0 and ex["loaded_bytes"]["demand"] > 0
    finally:
        llm.close()


def _for_the_cpu(model, picked, tier, **fields):
    """Every block tensor and the output on the GPU but the `picked` ones, which the CPU computes from
    `tier`: on disk, dense ones stream through the host pool and stacked experts are paged in by expert
    (odd ones on disk) as routers select them; in RAM, they stay resident."""

    def placed(t):
        if not picked(t.name):
            return dataclasses.replace(t, tier="gpu", compute="gpu") if t.layer >= 0 or t.name.startswith("output") else t
        experts = tuple(tier if e % 2 else "ram" for e in range(len(t.experts)))
        return dataclasses.replace(t, tier=tier, compute="cpu", experts=experts)

    return _design_plan(model, placed, **fields)


@pytest.mark.parametrize("which", ["paged experts", "host-pool ffn"])
def test_prompts_over_cpu_weights_that_change_within_a_graph(moe_model, dense_model, which):
    """A prompt batch (>= 32 tokens) beside CPU weights whose bytes are valid only while their layer runs:
    llama.cpp's op offload would copy them to the GPU when the graph split starts, before the hooks
    filled them. Equal to the same plan with those tensors resident in RAM and no op offload."""
    import re

    model, pattern = moe_model, r"_exps\."
    if which == "host-pool ffn":
        model, pattern = dense_model, r"blk\.\d+\.ffn_(up|gate|down)\."  # 4 layers through 2 slots
    picked = lambda name: re.search(pattern, name) is not None  # noqa: E731
    kwargs = dict(n_ctx=256, logits_all=True, verbose=False, n_threads=4)
    # the CPU buffer types the disk plan loads with: plain memory, not repacked (paged experts are written by
    # expert, host-pool slots are refilled per pass); op offload off, as the disk plan sets it
    buffers = {"use_extra_bufts": False, "no_host": True}
    same_kernels = {"model_params": buffers, "context_params": {"op_offload": False}}
    resident = hypura.Llama(str(model), plan=_for_the_cpu(model, picked, "ram"), param_overrides=same_kernels, **kwargs)
    tokens = resident.tokenize(b"The quick brown fox jumps over the lazy dog. " * 6)
    assert len(tokens) >= 32  # CUDA offloads a host weight's op from batches of 32 tokens
    want = _logits(resident, tokens)
    resident.close()
    llm = hypura.Llama(str(model), plan=_for_the_cpu(model, picked, "disk", staging_slots=2), **kwargs)
    try:
        assert (llm._pager is not None) == (which == "paged experts")
        got = _logits(llm, tokens)
        # the same CPU kernels read the same bytes (on the H200 the reference once had repacking off while the
        # host pool's layers were repacked, and the two differed by up to 0.39): bit-equal, but for the
        # pager's router hook, whose graph split alone moves H200 prompt logits by <= 2.4e-7
        # (H200, 2026-12-03: the same with a no-op hook on resident experts)
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 if which == "paged experts" else 0)
        assert llm.stats()["stream"]["bytes"].get("disk", 0) > 0  # read within the prompt's graph
        assert not llm.context_params.op_offload  # so the CPU computes them for the prompt too
    finally:
        llm.close()


def test_per_step_paths_on_the_gpu(dense_model):
    """RAM blocks with a path per step: a prompt batch streams them into GPU slots (the logits of GPU-resident
    weights), a one-token step computes them on the CPU from their pinned copy (the logits of the same blocks
    resident in plain RAM, not repacked); then back, with graphs built anew at each change."""
    def ram_blocks(t):
        if t.layer >= 0:
            return dataclasses.replace(t, tier="ram", compute="cpu")
        return dataclasses.replace(t, tier="gpu", compute="gpu") if t.name.startswith("output") else t

    kwargs = dict(n_ctx=256, logits_all=True, verbose=False, n_threads=4)
    resident = hypura.Llama(str(dense_model), n_gpu_layers=-1, **kwargs)
    tokens = resident.tokenize(b"The quick brown fox jumps over the lazy dog. " * 6)
    batch_want = _logits(resident, tokens)
    resident.close()
    cpu_plan = _design_plan(dense_model, ram_blocks)
    plain = {"model_params": {"use_extra_bufts": False, "no_host": True}}
    on_cpu = hypura.Llama(str(dense_model), plan=cpu_plan, param_overrides=plain, **kwargs)
    tokens_want = _decode_logits(on_cpu, tokens[:6])
    on_cpu.close()
    blocks = tuple(sorted(t.name for t in cpu_plan.tensors if t.layer >= 0))
    plan = dataclasses.replace(cpu_plan, step_paths=((4, (), 0.0), (512, blocks, 0.0)), pool_slots=3)
    llm = hypura.Llama(str(dense_model), plan=plan, **kwargs)
    try:
        assert np.array_equal(_logits(llm, tokens), batch_want)
        loads = llm.stats()["stream"]["loads"]
        assert loads > 0
        assert np.array_equal(_decode_logits(llm, tokens[:6]), tokens_want)
        assert llm.stats()["stream"]["loads"] == loads
        assert np.array_equal(_logits(llm, tokens), batch_want)
    finally:
        llm.close()


def _experts_in_ram(t):
    if t.experts:
        n = len(t.experts)
        return dataclasses.replace(t, tier="ram", compute="cpu", experts=("ram",) * n, expert_compute=("cpu",) * n)
    return dataclasses.replace(t, tier="gpu", compute="gpu") if t.name != "token_embd.weight" else t


GPU_KWARGS = dict(n_ctx=256, logits_all=True, verbose=False, n_threads=4)


def _pinned_plan_and_vanilla(moe_model, **fields):
    """The design plan with the experts in pinned RAM and the rest on the GPU (other plan fields as given), and what
    llama.cpp computes so with -lm none: (plan, tokens, (a prompt's logits, one token at a time's logits))."""
    plan = _design_plan(moe_model, _experts_in_ram)
    plan = dataclasses.replace(plan, traffic=dataclasses.replace(plan.traffic, host_pinned=True, op_offload=True),
                               **fields)
    pinned = {"model_params": {"load_mode": llama_cpp.LLAMA_LOAD_MODE_NONE, "no_host": False,
                               "use_extra_bufts": False}}
    vanilla = hypura.Llama(str(moe_model), n_gpu_layers=99, override_tensor="exps=CPU", param_overrides=pinned,
                           **GPU_KWARGS)
    tokens = vanilla.tokenize(b"The quick brown fox jumps over the lazy dog. " * 8)
    want = _logits(vanilla, tokens), _decode_logits(vanilla, tokens[:6])
    vanilla.close()
    return plan, tokens, want


def test_per_step_expert_stacks_on_the_gpu(moe_model):
    """The experts' stacks with a path per step: a prompt batch streams them whole into GPU slots and the GPU
    computes them there (what llama.cpp's op offload computes from -lm none's pinned copies, bitwise), a one-token
    step computes them on the CPU from their pinned home (-lm none's decode); then back."""
    stacks = tuple(sorted(t.name for t in _design_plan(moe_model, _experts_in_ram).tensors if t.experts))
    plan, tokens, want = _pinned_plan_and_vanilla(moe_model, step_paths=((4, (), 0.0), (512, stacks, 0.0)),
                                                  pool_slots=3)
    llm = hypura.Llama(str(moe_model), plan=plan, **GPU_KWARGS)
    try:
        assert np.array_equal(_logits(llm, tokens), want[0])
        loads = llm.stats()["stream"]["loads"]
        assert loads > 0
        assert np.array_equal(_decode_logits(llm, tokens[:6]), want[1])
        assert llm.stats()["stream"]["loads"] == loads
        assert np.array_equal(_logits(llm, tokens), want[0])
    finally:
        llm.close()


@pytest.mark.parametrize("piece", ["default", "one page"])
def test_a_plan_that_pins_cpu_weights(moe_model, piece, monkeypatch):
    """A plan whose CPU weights are held pinned (Traffic.host_pinned: the experts here) keeps them at home in the
    mapped file, unrepacked, their pages registered with the GPU, and computes what llama.cpp computes with the same
    placement and -lm none (pinned host weights): a prompt's experts offloaded at the link's rate, a token's on the
    CPU, bitwise. With pieces of one page every weight is larger than a piece, as a real model's are beside the
    default piece: CUDA refuses a copy across two registrations, so none may cross."""
    from hypura.runtime import mapped_weights

    monkeypatch.setattr(mapped_weights, "PIN_MAPPED", True)  # the path proven here, whatever the setting's default
    if piece == "one page":
        monkeypatch.setattr(mapped_weights, "PIECE_BYTES", mmap.PAGESIZE)
    plan, tokens, want = _pinned_plan_and_vanilla(moe_model)
    llm = hypura.Llama(str(moe_model), plan=plan, **GPU_KWARGS)
    try:
        names = [t.name for t in llm.header.tensors]
        experts = sum(t.nbytes for t in llm.header.tensors if "_exps" in t.name)
        for name, buft in _buffers(llm.model, names).items():
            if "_exps" in name:
                assert buft == "CPU_Mapped", name  # at home in Hypura's mapping of the file
            elif name == "token_embd.weight":  # the plan's RAM tier: host memory, pinned or not
                assert not buft.startswith("CUDA") or buft == "CUDA_Host", buft
            else:  # the plan's GPU tier: GPU memory, not CUDA_Host's pinned host memory
                assert buft.startswith("CUDA") and buft != "CUDA_Host", (name, buft)
        pinned = llm._runtime.mapped.stats
        assert pinned.registered and pinned.nbytes >= experts and pinned.refused == 0
        assert np.array_equal(_logits(llm, tokens), want[0])
        assert np.array_equal(_decode_logits(llm, tokens[:6]), want[1])
    finally:
        llm.close()


def test_the_gpu_times_a_prompt_micro_batch_on_a_models_blocks(moe_model):
    """The profile's GPU prompt rate (profile/gpu_compute.py): a whole micro-batch evaluated on the GPU, timed."""
    from hypura.modelfile import read_header
    from hypura.profile.gpu_compute import time_prompts
    from hypura.units import ModelDims

    seconds = time_prompts([str(moe_model)], ModelDims.from_header(read_header(moe_model)).n_vocab)
    assert len(seconds) == 1 and 0 < seconds[0] < 10
