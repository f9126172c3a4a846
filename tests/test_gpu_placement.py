"""Placement hooks on a CUDA build: tiers land where asked, defaults equal llama.cpp's own."""

import ctypes
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
